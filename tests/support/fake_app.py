"""The real app over fake engines, for the HTTP-layer tests: settings, held syntheses, recording fakes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from fastapi.testclient import TestClient

from app.engines.fake import FakeBehaviour, FakeEngine
from app.main import create_app
from app.settings import Settings


def make_settings(tmp_path, **pool) -> Settings:
    pool_cfg = {"workers": 2, "max_queue": 2, "queue_timeout_s": 5.0, "request_timeout_s": 30.0}
    pool_cfg.update(pool)
    return Settings(
        dev={"fake_engine": True},
        pool=pool_cfg,
        server={"access_log": True, "drain_timeout_s": 5},
        voices={"dir": str(tmp_path / "voices")},
    )


def hold(behaviour: FakeBehaviour) -> threading.Event:
    """Make every synthesis wait until the returned event is set."""
    behaviour.gate = threading.Event()
    return behaviour.gate


def wait_queued(client, running: int = 1, queued: int = 1, timeout: float = 5.0) -> None:
    """Poll the pool until ``running`` jobs run and ``queued`` wait (no sleeping to order events)."""
    stats = client.app.state.runtime.pool.stats
    deadline = time.monotonic() + timeout
    while (stats()["running"], stats()["queued"]) != (running, queued):
        assert time.monotonic() < deadline, f"pool never reached {running} running, {queued} queued: {stats()}"
        time.sleep(0.005)


def duration_of(b: FakeBehaviour, speed: float = 1.0) -> float:
    return b.chunks * int(b.chunk_s * b.sample_rate / speed) / b.sample_rate


class RecordingEngine(FakeEngine):
    """A FakeEngine that keeps every SynthesisRequest it is given."""

    def __init__(self, behaviour: FakeBehaviour, seen: list) -> None:
        super().__init__(behaviour)
        self.seen = seen

    def synthesize(self, req, cancel):
        self.seen.append(req)
        yield from super().synthesize(req, cancel)


class StubLibrary:
    """Stands in for the voice library: names(), features(name, family) and features_and_id."""

    def __init__(self, *names: str) -> None:
        self._names = list(names)

    def names(self) -> list[str]:
        return list(self._names)

    def features(self, name: str, family: str) -> Any:
        return {"voice": name} if name in self._names else None

    def features_and_id(self, name: str, family: str) -> tuple[Any, str]:
        return self.features(name, family), f"stub-{name}"


def client_maker(stack: ExitStack, tmp_path, behaviour: FakeBehaviour, seen: list) -> Callable[..., TestClient]:
    """``make(pool=None, **behaviour_fields)``: a started TestClient over RecordingEngines.

    Behaviour fields are set before the engines are built (``sample_rate`` is read then).
    """

    def make(pool: dict | None = None, **fields: Any) -> TestClient:
        for key, value in fields.items():
            setattr(behaviour, key, value)
        settings = make_settings(tmp_path, **(pool or {}))
        app = create_app(settings, engine_factory=lambda i: RecordingEngine(behaviour, seen))
        client = stack.enter_context(TestClient(app))
        stack.callback(lambda: behaviour.gate.set() if behaviour.gate is not None else None)
        return client

    return make
