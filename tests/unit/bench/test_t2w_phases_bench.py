"""bench/probes/t2w_phases.py's phase loop and report, on the fake engine (no torch)."""

from __future__ import annotations

from app.engines.fake import FakeBehaviour, FakeEngine
from bench.probes.t2w_phases import Recorder, _pct, header, line, phase


def test_a_phase_runs_every_request_and_reports_its_rounds():
    engine = FakeEngine(FakeBehaviour(chunks=3, chunk_s=0.2))
    engine.recorder = Recorder()
    engine.recorder.on_flow_round(4, 0.1)  # before the phase: not counted
    row = phase(engine, 3, requests=2, first_chunk_tokens=5)
    assert row["requests"] == 6 and not row["errors"]
    assert abs(row["audio_s"] - 6 * (0.2 + 0.2 + 5 / 25)) < 1e-6  # the fake sizes its first chunk from the field
    assert row["ttfa_p50_s"] is not None and row["audio_s_per_s"] > 0
    assert row["flow_rounds"] == 0 and row["flow_batch_mean"] is None
    assert line("on", row).startswith("| on | 3 | 6 |") and header().count("|---") >= 1


def test_percentiles_and_the_recorder():
    assert _pct([], 0.5) is None and _pct([3.0, 1.0, 2.0], 0.95) == 3.0 and _pct([1.0, 2.0], 0.0) == 1.0
    rec = Recorder()
    rec.on_step(4, 0.01)
    rec.on_tokens(4)
    rec.on_flow_round(2, 0.2)
    assert rec.mark() == (1, 1) and rec.tokens == 4
