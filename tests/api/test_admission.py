"""Admission at the edge: the route table decides what is admitted; the permit goes back on every path."""

from __future__ import annotations

import threading
import time

import pytest

from app.api.routes import ENDPOINTS, SYNTHESIS_ROUTES, match
from tests.api.conftest import hold


@pytest.mark.parametrize("method, path, expected", [
    ("POST", "/v1/tts", "/v1/tts"),
    ("GET", "/v1/tts", None),
    ("POST", "/v1/audio/speech", "/v1/audio/speech"),
    ("GET", "/inference_sft", "/inference_sft"),
    ("POST", "/inference_instruct2", "/inference_instruct2"),
    ("POST", "/inference_nothing", None),
    ("GET", "/health/ready", None),
    ("POST", "/v1/voices", None),
])
def test_match_uses_the_route_table(method, path, expected):
    r = match({"type": "http", "method": method, "path": path})
    assert (r.path if r is not None else None) == expected


def test_every_table_route_is_served_and_labelled(client):
    schema = client.get("/openapi.json").json()["paths"]
    for r in SYNTHESIS_ROUTES:
        assert set(r.methods) == {m.upper() for m in schema[r.path]}, r.path
    assert ENDPOINTS == tuple(r.path for r in SYNTHESIS_ROUTES)
    metrics = client.get("/metrics").text
    for path in ENDPOINTS:
        assert f'tts_requests_total{{endpoint="{path}",outcome="ok"}} 0.0' in metrics


def wait_for(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_permit_goes_back_on_every_path(client_factory, behaviour):
    client = client_factory(workers=1, max_queue=0)
    stats = client.app.state.runtime.pool.stats
    cases = [
        ("POST", "/v1/tts", {"json": {"text": "hi"}}, 200),
        ("POST", "/v1/tts", {"json": {"text": ""}}, 400),  # the engine refuses it
        ("POST", "/v1/tts", {"json": {"text": "hi", "voice": "nobody"}}, 400),  # refused while planning
        ("POST", "/v1/tts", {"content": b"{bad", "headers": {"content-type": "application/json"}}, 422),
        ("POST", "/v1/audio/speech", {"json": {"model": "nope", "input": "x", "voice": "alloy"}}, 404),
        ("GET", "/inference_sft", {"params": {"tts_text": "hi", "spk_id": "fake_male"}}, 200),
    ]
    for method, path, kwargs, status in cases:
        assert client.request(method, path, **kwargs).status_code == status, (path, kwargs)
        assert stats()["in_flight"] == 0, (path, kwargs)


def test_a_full_server_refuses_at_once_and_other_routes_still_answer(client_factory, behaviour):
    client = client_factory(workers=1, max_queue=0)
    gate = hold(behaviour)
    held = threading.Thread(target=lambda: client.post("/v1/tts", json={"text": "held"}))
    held.start()
    wait_for(lambda: behaviour.started)
    assert client.post("/v1/tts", json={"text": "x"}).status_code == 503
    assert client.get("/v1/speakers").status_code == 200  # not a synthesis route: never admitted
    assert client.get("/health/live").status_code == 200
    gate.set()
    held.join(10)
    wait_for(lambda: client.app.state.runtime.pool.stats()["in_flight"] == 0)
