"""The GPU check ships working: `python -m bench gpu --device cpu --quick`, exactly as CI runs it.

On a CPU it builds nothing (the tiny v2 model), checks parity, seeded sampling, half-precision
drift, per-stage time, streaming at concurrency 1/4/16, host syncs per step and the running
batch's stall when 16 requests join at once (one-by-one vs batched prefill), and writes
its markdown and JSON report. The GPU figures need a GPU (docs/gpu.md).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_gpu_check_runs_on_a_cpu_and_writes_its_report(tiny_models, tmp_path):
    tiny_models(2)  # built once per test session (the check would build the same dir)
    out = tmp_path / "gpu_check_cpu"
    run = subprocess.run([sys.executable, "-m", "bench", "gpu", "--device", "cpu", "--quick", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["environment"]["name"] == "cpu" and doc["mode"] == "quick"
    assert doc["parity"]["tokens_equal"] == doc["parity"]["requests"] == 3
    assert doc["parity"]["max_logp_diff"] < 1e-4
    assert doc["seeded"]["alone_equals_batched"] is True and doc["seeded"]["cpu_equals_device"] is None
    assert set(doc["drift"]) == {"fp16", "bf16"}
    assert doc["drift"]["fp16"]["kv_dtype"] == "float16" and doc["drift"]["fp16"]["top1_agree"] >= 0.9
    assert all(doc["stages"][k] > 0 for k in ("llm", "flow", "hift"))
    assert doc["syncs"]["proxy"]["max"] == 1
    levels = {p["concurrency"]: p for p in doc["streaming"]}
    assert set(levels) == {1, 4, 16}
    for point in levels.values():
        assert point["error_count"] == 0 and point["requests"] >= 1 and point["ttfa_p50_s"] > 0
    assert levels[16]["llm_mean_batch"] > 1
    assert doc["gpu_memory"] is None
    pf = doc["prefill"]
    assert pf["first_tokens_equal"] is True
    assert pf["one_by_one"]["prefill_forwards"] == 16 and pf["batched"]["prefill_forwards"] == 1
    assert pf["one_by_one"]["all_joined_at_once"] and pf["batched"]["all_joined_at_once"]
    assert pf["batched"]["gap_ms"] > pf["batched"]["prefill_ms"] > 0
    md = out.with_suffix(".md").read_text()
    tw = doc["token2wav"]
    assert tw["levels"] == [1, 4] and set(tw["runs"]) == {"off", "on"}
    for setting, rows in tw["runs"].items():
        assert [r["concurrency"] for r in rows] == [1, 4]
        assert all(not r["errors"] and r["requests"] == r["concurrency"] and r["ttfa_p50_s"] > 0 for r in rows)
        assert all((r["flow_rounds"] > 0) == (setting == "on") for r in rows)
    assert "none of these numbers is a GPU figure" in md and "## Streaming" in md and "## Prefill" in md
    assert "## Batched token2wav" in md and "| on | 4 |" in md


def test_its_cpu_against_device_comparison_runs_where_both_are_the_cpu(engines):
    """The CUDA branch of the seeded check (a CPU copy of the LLM against the engine's), run with a CPU engine:
    the same seed must give the same tokens on both."""
    from types import SimpleNamespace

    from bench.gpu_check import TEXTS, seeded

    eng = engines(2)
    out = seeded(eng, SimpleNamespace(type="cuda"), TEXTS[:3])
    assert out["alone_equals_batched"] is True
    assert out["cpu_equals_device"] is True and out["first_difference"] is None
    assert out["cpu_tokens"] == out["tokens"] > 0
