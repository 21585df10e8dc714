"""The lifespan yields a whole runtime: every service built, nothing for the routers to None-check."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.engines.fake import FakeEngine
from app.main import create_app
from app.runtime import running
from tests.api.conftest import make_settings


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
