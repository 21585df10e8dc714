"""bench/cost.py: its cases and variants, goal lines and table (no model runs)."""

from __future__ import annotations

import pytest

from bench.cost import CASES, DEFAULT_VARIANTS, ONLY, VARIANTS, main
from bench.report import cost_markdown as markdown
from bench.report import stream_goals


def case(cpu_rtf: float, flow: float, ttfa: float = 1.0, conc: int = 1, stream: bool = False) -> dict:
    return {"concurrency": conc, "stream": stream, "cpu_s_per_request": cpu_rtf * 4, "wall_s": 5.0, "rtf": 1.2,
            "cpu_rtf": cpu_rtf, "audio_s_per_wall_s": 0.8, "ttfa_s": ttfa, "audio_s_per_request": 4.0,
            "flow_frames_per_request": 176, "first_hop_flow_frames": 100 if stream and conc == 1 else None,
            "stages_s_per_request": {"frontend": 0.1, "llm": 1.0, "flow": flow, "hift": 0.1}, "peak_rss_mb": 3000}


def cases(whole: float, streamed: float, ttfa: float) -> dict:
    return {"cases": {"long-whole": case(whole, 1.0, ttfa=4.0), "long-stream": case(streamed, 1.4, ttfa, stream=True),
                      "long-whole-c4": case(whole, 1.0, 5.0, 4), "long-stream-c4": case(streamed * 1.2, 2.0, 6.0, 4,
                                                                                          True)},
            "ran": "fp32"}


def test_the_default_variants_are_known_and_each_restriction_names_real_cases():
    assert set(DEFAULT_VARIANTS.split(",")) <= set(VARIANTS) and VARIANTS["defaults"] == {}
    assert all(set(names) <= {n for n, *_ in CASES} for names in ONLY.values())
    assert {(stream, c) for _, _, stream, c in CASES} == {(False, 1), (True, 1), (False, 4), (True, 4)}


def test_an_unknown_variant_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--variants", "defaults,fp64"])
    assert exc.value.code == 2 and "unknown variant(s) fp64" in capsys.readouterr().err


def test_stream_goals_grade_the_defaults_at_full_size_only():
    res = {"full": {"defaults": cases(3.0, 3.3, 2.0), "recompute": cases(3.0, 6.0, 2.5)},
           "tiny": {"defaults": cases(0.1, 0.3, 0.2)}}
    text = "\n".join(stream_goals(res))
    assert "full defaults c=1: streamed CPU-s per audio-s / whole = 1.10x (3.30 vs 3.00; goal <= 1.2x: met)" in text
    assert "flow seconds 1.40x (goal <= 1.5x: met)" in text
    assert "full defaults c=4: streamed CPU-s per audio-s / whole = 1.32x (3.96 vs 3.00; goal <= 1.2x: MISSED)" in text
    assert "flow seconds 2.00x (goal <= 1.5x: MISSED)" in text
    assert "full recompute c=1: streamed CPU-s per audio-s / whole = 2.00x (6.00 vs 3.00; goal <= 1.2x)," in text
    assert "tiny defaults c=1: streamed CPU-s per audio-s / whole = 3.00x (0.30 vs 0.10; goal <= 1.2x)," in text
    assert "full: first audio with the flow cache 2.00 s vs without 2.50 s (goal: no later): met" in text


def test_the_stream_table_has_peak_rss_and_the_goals():
    res = {"full": {"defaults": cases(3.0, 3.3, 2.0)}}
    table = markdown({"commands": ["python -m bench cost"], "host": {"cores": 2}, "results": res,
                      "goals": stream_goals(res)})
    assert table.startswith("# Streamed vs whole on the server's defaults")
    assert "| full | defaults (fp32) | long-stream | 1 | 13.20 |" in table and "| 3000 |" in table
    assert "## Goals" in table and "- full defaults c=1" in table
