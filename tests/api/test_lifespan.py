"""The lifespan yields a whole runtime: every service built, nothing for the routers to None-check."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.engines.fake import FakeEngine
from app.main import create_app
from app.runtime import running
from tests.support.fake_app import make_settings


def test_the_lifespan_yields_a_whole_runtime_and_publishes_it(tmp_path, behaviour):
    app = create_app(make_settings(tmp_path), engine_factory=lambda i: FakeEngine(behaviour))
    assert running(app) is None  # nothing exists before the lifespan built it
    with TestClient(app) as client:
        runtime = running(app)
        assert runtime is not None and runtime is app.state.runtime
        assert runtime.pool.ready and runtime.speech.pool is runtime.pool
        assert runtime.speech.library is runtime.voices and runtime.voices.names() == []
        assert runtime.metrics is app.state.boot.metrics is not None
        assert runtime.session_limits.max_utterance_chars == runtime.settings.server.max_text_chars
        assert runtime.model_created > 0 and not runtime.draining
        assert client.get("/v1/speakers").json()["speakers"] == ["fake_female", "fake_male"]
        assert client.post("/v1/tts", json={"text": "hi"}).status_code == 200
    assert runtime.draining and runtime.pool.draining  # shut down, still readable


def test_a_failed_library_start_closes_the_loaded_slots(tmp_path, behaviour):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the voices dir should be")
    engines: list[FakeEngine] = []

    def factory(i: int) -> FakeEngine:
        engines.append(FakeEngine(behaviour))
        return engines[-1]

    settings = make_settings(tmp_path)
    settings.voices.dir = str(blocker / "voices")
    app = create_app(settings, engine_factory=factory)
    with pytest.raises(OSError), TestClient(app):
        pass
    assert engines and all(e.closed for e in engines)
    assert running(app) is None


# -- admission defaults that fit the machine ----------------------------------------------------------
def _batched_settings(tmp_path, **pool):
    from app.settings import load_settings

    v2 = tmp_path / "v2"
    v2.mkdir(exist_ok=True)
    (v2 / "cosyvoice2.yaml").write_text("")
    return load_settings(None, engine={"model_dir": str(v2)}, pool=pool)


def test_adaptive_starts_per_core_on_a_cpu_at_the_batch_on_a_gpu_and_at_the_ceiling_when_sized_by_hand(
        tmp_path, monkeypatch):
    import os

    from app.lifespan import CPU_START_PER_CORE, admission_start

    monkeypatch.delenv("COSYSERVE_POOL__WORKERS", raising=False)
    monkeypatch.delenv("COSYSERVE_POOL__MAX_QUEUE", raising=False)
    s = _batched_settings(tmp_path)
    assert (s.pool.workers, s.pool.queue_limit, s.pool.admission) == (16, 0, "adaptive")
    cores = max(1, os.cpu_count() or 1)
    start, why = admission_start(s, "cpu", 16)
    assert start == min(16, CPU_START_PER_CORE * cores) and "CPU" in why
    assert admission_start(s, "cuda", 16)[0] == 16  # the batch size
    by_hand = _batched_settings(tmp_path, workers=6)
    assert admission_start(by_hand, "cpu", 6) == (6, "pool sized by hand: start at its ceiling")


@pytest.mark.parametrize("mode, expected", [
    ("adaptive", "admission: adaptive, limit starts at 3 and follows measured latency"),
    ("fixed", "admission: fixed, 5 request(s) at once (pool.workers 3 + pool.max_queue 2"),
])
def test_the_startup_log_says_what_admission_was_chosen_and_why(tmp_path, behaviour, caplog, mode, expected):
    caplog.set_level("INFO", logger="cosyserve")
    settings = make_settings(tmp_path, workers=3, max_queue=2 if mode == "fixed" else 0, admission=mode)
    with TestClient(create_app(settings, engine_factory=lambda i: FakeEngine(behaviour))):
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("admission:")]
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_no_automatic_collection_while_loading_and_the_loaded_heap_is_frozen_until_shutdown(tmp_path, behaviour):
    import gc

    seen: list[bool] = []

    def factory(i: int) -> FakeEngine:
        seen.append(gc.isenabled())  # the engine loads (is built) with automatic collection paused
        return FakeEngine(behaviour)

    assert gc.isenabled() and gc.get_freeze_count() == 0
    app = create_app(make_settings(tmp_path), engine_factory=factory)
    with TestClient(app) as client:
        assert seen and not any(seen)
        assert gc.isenabled()  # back on once loaded
        assert gc.get_freeze_count() > 1000  # what the loaded server holds: skipped by full collections
        assert client.post("/v1/tts", json={"text": "hi"}).status_code == 200
    assert gc.get_freeze_count() == 0  # thawed at shutdown: an app built again does not pile them up
