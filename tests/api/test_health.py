"""Probes you can trust: a bounded engine health check, and liveness that notices a wedged slot."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.engines.fake import FakeBehaviour, FakeEngine
from app.main import create_app
from tests.support.fake_app import make_settings


class WedgedEngine(FakeEngine):
    """Synthesis and health checks that block until released, ignoring the cancel flag."""

    def __init__(self, behaviour: FakeBehaviour, release: threading.Event, wedge_health: bool = False) -> None:
        super().__init__(behaviour)
        self.release = release
        self.wedge_health = wedge_health

    def synthesize(self, req, cancel):
        with self.b.lock:
            self.b.started.append(req.request_id)
        self.release.wait(30)
        yield from super().synthesize(req, cancel)

    def health_check(self) -> None:
        if self.wedge_health:
            self.release.wait(30)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def wait_for(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def metric(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_slot_stuck_past_deadline_and_grace_fails_liveness(tmp_path, release, caplog):
    b = FakeBehaviour()
    settings = make_settings(tmp_path, workers=1, max_queue=0, request_timeout_s=0.2, stuck_grace_s=3.0)
    with TestClient(create_app(settings, engine_factory=lambda i: WedgedEngine(b, release))) as client:
        answers: list[int] = []
        caller = threading.Thread(target=lambda: answers.append(client.post("/v1/tts", json={"text": "x"}).status_code))
        caller.start()
        wait_for(lambda: answers == [504])  # the deadline fired; the thread is still in the engine
        assert client.get("/health/live").status_code == 200  # within the grace period: not yet stuck
        with caplog.at_level(logging.ERROR):
            wait_for(lambda: client.get("/health/live").status_code == 503)
        body = client.get("/health/live").json()
        assert body == {"status": "stuck", "stuck_slots": [0]}
        assert any("stuck in the engine" in r.getMessage() for r in caplog.records)
        assert metric(client, "tts_slots_stuck") == 1.0 and metric(client, "tts_stuck_jobs_total") == 1.0
        release.set()  # the engine comes back: the slot is freed and the process is live again
        wait_for(lambda: client.get("/health/live").status_code == 200)
        assert metric(client, "tts_slots_stuck") == 0.0 and metric(client, "tts_stuck_jobs_total") == 1.0
        caller.join(10)


def test_no_deadline_means_no_stuck_detection(tmp_path, release):
    b = FakeBehaviour()
    settings = make_settings(tmp_path, workers=1, max_queue=0, request_timeout_s=0, stuck_grace_s=0)
    with TestClient(create_app(settings, engine_factory=lambda i: WedgedEngine(b, release))) as client:
        caller = threading.Thread(target=lambda: client.post("/v1/tts", json={"text": "x"}))
        caller.start()
        wait_for(lambda: b.started)
        assert client.get("/health/live").status_code == 200
        release.set()
        caller.join(10)


def test_a_health_check_that_hangs_fails_readiness_within_the_timeout(tmp_path, release):
    b = FakeBehaviour()
    settings = make_settings(tmp_path, workers=1, health_timeout_s=0.2)
    engines = lambda i: WedgedEngine(b, release, wedge_health=True)  # noqa: E731
    with TestClient(create_app(settings, engine_factory=engines)) as client:
        t0 = time.monotonic()
        r = client.get("/health/ready")
        assert r.status_code == 503 and "engine health check failed" in r.json()["reasons"]
        assert time.monotonic() - t0 < 2.0
        assert client.get("/health/live").status_code == 200
        release.set()  # once the check returns, its slot is back and the probe passes again
        wait_for(lambda: client.get("/health/ready").status_code == 200)
