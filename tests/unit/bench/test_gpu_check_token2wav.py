"""The GPU check's token2wav phase loop and its report rows, on the fake engine (no torch)."""

from __future__ import annotations

from app.engines.fake import FakeBehaviour, FakeEngine
from bench.gpu_check import Recorder, _pct, token2wav_point
from bench.report import t2w_row


def test_a_point_runs_every_request_and_reports_its_rounds():
    engine = FakeEngine(FakeBehaviour(chunks=3, chunk_s=0.2))
    engine.recorder = Recorder()
    engine.recorder.on_flow_round(4, 0.1)  # before the point: not counted
    row = token2wav_point(engine, 3, requests=2)
    assert row["requests"] == 6 and not row["errors"] and row["audio_s"] > 0
    assert row["ttfa_p50_s"] is not None and row["audio_s_per_s"] > 0
    assert row["flow_rounds"] == 0 and row["flow_batch_mean"] is None
    assert t2w_row("on", row)[:3] == ["on", 3, 6]


def test_percentiles_and_the_recorder():
    assert _pct([], 0.5) is None and _pct([3.0, 1.0, 2.0], 0.95) == 3.0 and _pct([1.0, 2.0], 0.0) == 1.0
    rec = Recorder()
    rec.on_step(4, 0.01)
    rec.on_tokens(4)
    rec.on_flow_round(2, 0.2)
    assert (len(rec.steps), len(rec.rounds)) == (1, 1)
