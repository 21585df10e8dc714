"""Admission at the edge: the route table decides what is admitted; the permit goes back on every path."""

from __future__ import annotations

import threading
import time

import pytest

from app.api.routes import ENDPOINTS, SYNTHESIS_ROUTES, match
from tests.support.fake_app import hold


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


# -- adaptive (the default) and fixed admission over HTTP and WebSocket -------------------------------
def _hold_one(client, behaviour) -> tuple[threading.Event, threading.Thread, list[int]]:
    """One /v1/tts request held inside the engine; (gate, its thread, [its status])."""
    gate = hold(behaviour)
    status: list[int] = []
    before = len(behaviour.started)
    t = threading.Thread(target=lambda: status.append(client.post("/v1/tts", json={"text": "held"}).status_code))
    t.start()
    wait_for(lambda: len(behaviour.started) > before)
    return gate, t, status


def test_adaptive_overload_is_an_immediate_503_with_retry_after_and_counted_as_over_budget(client_factory,
                                                                                          behaviour):
    from tests.support.metrics import scrape, value

    client = client_factory(workers=4, max_queue=0)  # the default mode: adaptive
    pool = client.app.state.runtime.pool
    assert pool.stats()["admission"]["mode"] == "adaptive"
    pool.gate.start_at(1)  # as if measured latency had brought the limit down to one request
    gate, held, status = _hold_one(client, behaviour)
    t0 = time.monotonic()
    r = client.post("/v1/tts", json={"text": "one too many"})
    refused_in = time.monotonic() - t0
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
    assert int(r.headers["retry-after"]) >= 1
    assert refused_in < 1.0  # at once: it did not wait for the held request (which never ends unless told)
    busy = scrape(client)
    assert value(busy, "tts_rejected_total", reason="over_budget") == 1
    assert value(busy, "tts_admission_limit", mode="adaptive") == 1
    assert value(busy, "tts_admission_ceiling") == 4
    assert value(busy, "tts_admission_load") == pytest.approx(1.0)
    assert value(busy, "tts_admission_lanes") == 0
    assert value(busy, "tts_admission_lane_paused_seconds_total") == 0
    assert value(busy, "tts_admission_predicted_wait_seconds") > 0
    gate.set()
    held.join(10)
    assert status == [200]
    wait_for(lambda: pool.stats()["in_flight"] == 0)
    assert value(scrape(client), "tts_admission_predicted_wait_seconds") == 0
    assert client.post("/v1/tts", json={"text": "room again"}).status_code == 200


def test_fixed_keeps_todays_behaviour_a_queue_then_503_queue_full(client_factory, behaviour):
    from tests.support.metrics import scrape, value

    client = client_factory(workers=1, max_queue=1, admission="fixed")
    gate, held, status = _hold_one(client, behaviour)
    queued: list[int] = []
    waiter = threading.Thread(target=lambda: queued.append(client.post("/v1/tts", json={"text": "q"}).status_code))
    waiter.start()
    wait_for(lambda: client.app.state.runtime.pool.stats()["queued"] == 1)  # admitted, waiting for the slot
    r = client.post("/v1/tts", json={"text": "third"})
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    s = scrape(client)
    assert value(s, "tts_rejected_total", reason="queue_full") == 1
    assert value(s, "tts_rejected_total", reason="over_budget") == 0
    assert value(s, "tts_admission_limit", mode="fixed") == 2
    gate.set()
    held.join(10)
    waiter.join(10)
    assert status == [200] and queued == [200]


def test_a_websocket_utterance_rides_in_a_lane_and_the_next_takes_the_gates_place(client_factory, behaviour):
    """At limit 1: an open utterance (text arriving over time) is a long job in a lane beside the limit;
    a second utterance, the lane taken, holds the limit's one place; a third and a short request are
    then refused at once; once the second is done, a short request runs beside the lane."""
    from tests.support.ws import PATH, send, utterance

    client = client_factory(workers=4, max_queue=0)
    pool = client.app.state.runtime.pool
    pool.gate.start_at(1)
    with client.websocket_connect(PATH) as first:
        send(first, "input.text", text="Riding in the lane.")
        wait_for(lambda: pool.stats()["admission"]["lanes"] == 1)
        with client.websocket_connect(PATH) as second:  # connecting takes no place
            send(second, "input.text", text="Holding the only place.")
            wait_for(lambda: pool.stats()["in_flight"] == 2)
            assert pool.stats()["admission"]["lanes"] == 1  # one lane per place of the limit
            with client.websocket_connect(PATH) as third:
                send(third, "input.text", text="No place.")
                event = third.receive_json()
                assert event["type"] == "error" and event["utterance"] == 1
                assert event["error"]["code"] == "overloaded" and event["error"]["retry_after_s"] >= 1
            r = client.post("/v1/tts", json={"text": "hi"})
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
            send(second, "input.done")
            utterance(second)
        wait_for(lambda: pool.stats()["in_flight"] == 1)  # the lane is still held ...
        assert client.post("/v1/tts", json={"text": "hi"}).status_code == 200  # ... and the place is free
        send(first, "input.done")
        utterance(first)
    wait_for(lambda: pool.stats()["in_flight"] == 0)
    assert pool.stats()["admission"]["lanes"] == 0
    assert pool.stats()["rejected"] == {"over_budget": 2}
    assert pool.stats()["admission"]["average_s"] is not None  # the short request: a sample
    assert pool.stats()["admission"]["load"] == 0


def test_measured_latency_brings_the_limit_down_and_503s_follow(client_factory, behaviour):
    """End to end over HTTP: requests slower than the budget lower the limit, then the excess is refused."""
    behaviour.first_chunk_delay_s = 0.12  # every request takes about 0.12 s ...
    client = client_factory(workers=4, max_queue=0, admission_budget_s=0.02)  # ... against a 20 ms budget
    pool = client.app.state.runtime.pool
    for _ in range(60):  # sequential: each runs alone, each is over budget (one step a second at most)
        assert client.post("/v1/tts", json={"text": "slow"}).status_code == 200
        if pool.stats()["admission"]["limit"] == 1:
            break
    assert pool.stats()["admission"]["limit"] == 1
    gate, held, status = _hold_one(client, behaviour)
    assert client.post("/v1/tts", json={"text": "refused"}).status_code == 503
    gate.set()
    held.join(10)
    assert status == [200]
