"""HTTP-layer fixtures: the real app with FakeEngines behind the real pool."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest
from fastapi.testclient import TestClient

from app.engines.fake import FakeBehaviour, FakeEngine
from app.main import create_app
from app.settings import Settings
from tests.support.fake_app import client_maker, make_settings


@pytest.fixture
def behaviour() -> FakeBehaviour:
    return FakeBehaviour()


@pytest.fixture
def start_app(behaviour) -> Iterator[Callable[[Settings], TestClient]]:
    """``start(settings)``: a started TestClient on the real app over FakeEngines; all stopped at teardown."""
    clients: list[TestClient] = []

    def start(settings: Settings) -> TestClient:
        client = TestClient(create_app(settings, engine_factory=lambda i: FakeEngine(behaviour)))
        client.__enter__()
        clients.append(client)
        return client

    yield start
    for c in clients:
        if behaviour.gate is not None:
            behaviour.gate.set()  # a held synthesis must end, or the shutdown drain waits for it
        c.__exit__(None, None, None)


@pytest.fixture
def open_client(tmp_path, start_app) -> Callable[..., TestClient]:
    """``make(pool=None, server=None, websocket=None, cache=None)``: a started TestClient over FakeEngines,
    sections overridden."""
    def make(pool=None, server=None, websocket=None, cache=None) -> TestClient:
        return start_app(Settings(
            dev={"fake_engine": True},
            pool={"workers": 2, "max_queue": 2, "queue_timeout_s": 5.0, "request_timeout_s": 30.0, **(pool or {})},
            server={"access_log": False, "drain_timeout_s": 5, **(server or {})},
            voices={"dir": str(tmp_path / "voices")},
            websocket=websocket or {},
            cache=cache or {},
        ))

    return make


@pytest.fixture
def client_factory(tmp_path, start_app) -> Callable[..., TestClient]:
    return lambda **pool: start_app(make_settings(tmp_path, **pool))


@pytest.fixture
def seen() -> list:
    """Requests a RecordingEngine saw (tests/support/fake_app.py)."""
    return []


@pytest.fixture
def make_client(tmp_path, behaviour, seen) -> Iterator[Callable[..., TestClient]]:
    """``make(pool=None, **behaviour_fields)``: a started TestClient over RecordingEngines."""
    with ExitStack() as stack:
        yield client_maker(stack, tmp_path, behaviour, seen)


@pytest.fixture
def client(client_factory) -> TestClient:
    return client_factory()
