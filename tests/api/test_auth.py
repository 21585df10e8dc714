"""API keys (``app/api/auth.py``) over the real app with FakeEngines: HTTP and WebSocket scopes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest
from fastapi import WebSocket
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from app.api.auth import KeyChecker, exposure_warning, is_loopback
from app.engines.fake import FakeEngine
from app.main import create_app
from app.settings import Settings
from tests.support.fake_app import hold, wait_queued

KEY = "sk-test-Zq7pX2vLr9"
OTHER = "sk-second-key-0042"
WRONG = "sk-wrong-key-abcdef"


def keyed_settings(tmp_path, keys=(KEY, OTHER), require_metrics_key=False, **pool) -> Settings:
    return Settings(
        dev={"fake_engine": True},
        pool={"workers": 2, "max_queue": 2, "queue_timeout_s": 5.0, "request_timeout_s": 30.0, **pool},
        server={"access_log": True, "drain_timeout_s": 5, "api_keys": list(keys)},
        voices={"dir": str(tmp_path / "voices")},
        metrics={"require_key": require_metrics_key},
    )


async def echo_query(websocket: WebSocket) -> None:
    """A WebSocket route for these tests: accept, send the query string it was given, close."""
    await websocket.accept()
    await websocket.send_json({"query": websocket.scope["query_string"].decode()})
    await websocket.close()


@pytest.fixture
def keyed(tmp_path, behaviour) -> Iterator[Callable[..., TestClient]]:
    with ExitStack() as stack:
        def make(**kwargs) -> TestClient:
            app = create_app(keyed_settings(tmp_path, **kwargs), engine_factory=lambda i: FakeEngine(behaviour))
            app.add_api_websocket_route("/v1/audio/speech/echo", echo_query)
            app.add_api_websocket_route("/ws/echo", echo_query)
            return stack.enter_context(TestClient(app))

        yield make
        if behaviour.gate is not None:
            behaviour.gate.set()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_missing_key_is_401_with_the_native_envelope_and_a_challenge(keyed):
    r = keyed().post("/v1/tts", json={"text": "hello"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="cosyserve"'
    err = r.json()["error"]
    assert err["code"] == "missing_api_key"
    assert err["request_id"] == r.headers["x-request-id"]
    assert "Authorization: Bearer" in err["message"]


def test_wrong_key_on_an_openai_route_is_openais_error_object(keyed):
    r = keyed().post("/v1/audio/speech", json={"model": "tts-1", "input": "hi", "voice": "alloy"},
                     headers=bearer(WRONG))
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="cosyserve", error="invalid_token"'
    assert r.json() == {"error": {"message": "the API key is not valid", "type": "invalid_request_error",
                                  "param": None, "code": "invalid_api_key"}}


@pytest.mark.parametrize("headers", [bearer(KEY), bearer(OTHER), {"X-API-Key": KEY}, {"authorization": f"bearer {KEY}"}],
                         ids=["bearer", "second-key", "x-api-key", "lowercase-scheme"])
def test_each_configured_key_works_in_either_header(keyed, headers):
    client = keyed()
    r = client.post("/v1/tts", json={"text": "hello"}, headers=headers)
    assert r.status_code == 200 and r.content[:4] == b"RIFF"
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "hi", "voice": "alloy"}, headers=headers)
    assert r.status_code == 200 and len(r.content) > 1000


@pytest.mark.parametrize("headers", [bearer(KEY[:-1]), bearer(KEY + "x"), {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"}, {"X-API-Key": ""}],
                         ids=["prefix", "longer", "no-scheme", "basic", "empty"])
def test_near_misses_are_refused(keyed, headers):
    assert keyed().get("/v1/speakers", headers=headers).status_code == 401


def test_every_api_route_needs_a_key(keyed):
    client = keyed()
    for method, path in [("GET", "/v1/speakers"), ("GET", "/v1/models"), ("GET", "/v1/audio/voices"),
                         ("GET", "/v1/audio/models"),
                         ("GET", "/v1/voices"), ("POST", "/v1/voices"), ("DELETE", "/v1/voices/x"),
                         ("GET", "/inference_sft"), ("POST", "/inference_zero_shot"), ("GET", "/no/such/route")]:
        r = client.request(method, path)
        assert r.status_code == 401, (method, path, r.status_code)


def test_probes_playground_and_docs_are_open(keyed):
    client = keyed()
    for path in ["/health/live", "/health/ready", "/", "/playground/playground.js", "/docs", "/openapi.json",
                 "/metrics"]:
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code)


def test_the_openapi_schema_documents_the_keys(keyed, client):
    schema = keyed().get("/openapi.json").json()
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert schema["security"] == [{"bearer": []}, {"apiKey": []}]
    assert "security" not in schema["paths"]["/v1/tts"]["post"]  # inherits the global requirement
    assert schema["paths"]["/health/ready"]["get"]["security"] == []
    assert schema["paths"]["/metrics"]["get"]["security"] == []
    assert "security" not in client.get("/openapi.json").json()  # keys off: nothing to document


def test_refusals_are_counted_by_reason(keyed):
    client = keyed()
    client.get("/v1/speakers")
    client.get("/v1/speakers", headers=bearer(WRONG))
    client.get("/v1/speakers", headers=bearer(WRONG))
    with pytest.raises(WebSocketDenialResponse), client.websocket_connect("/ws/echo"):
        pass
    client.get("/v1/speakers", headers=bearer(KEY))
    text = client.get("/metrics").text
    assert 'tts_unauthorized_total{reason="missing_api_key"} 2.0' in text
    assert 'tts_unauthorized_total{reason="invalid_api_key"} 2.0' in text


@pytest.mark.parametrize("path", ["/playground/../v1/speakers", "/health/../v1/speakers", "/playground/../../v1/voices"])
def test_an_open_prefix_does_not_reach_a_keyed_route(tmp_path, behaviour, path):
    """The key check and the router read the same decoded path: a path that is open by prefix
    is routed to the open handler (the static files, which stay inside their directory), never to the API."""
    from tests.support.waiting import run

    app = create_app(keyed_settings(tmp_path), engine_factory=lambda i: FakeEngine(behaviour))
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
             "server": ("testserver", 80), "client": ("127.0.0.1", 1234)}
    run(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 404


def test_metrics_can_require_a_key(keyed):
    client = keyed(require_metrics_key=True)
    assert client.get("/metrics").status_code == 401
    r = client.get("/metrics", headers={"X-API-Key": KEY})
    assert r.status_code == 200 and "tts_requests_total" in r.text


def test_a_request_without_a_key_takes_no_permit(keyed, behaviour):
    """Keys are checked before admission: with every worker and queue place taken, no key is 401, not 503."""
    gate = hold(behaviour)
    client = keyed(workers=1, max_queue=0)
    import threading

    first = threading.Thread(target=client.post, args=("/v1/tts",), kwargs={"json": {"text": "x"}, "headers": bearer(KEY)})
    first.start()
    try:
        wait_queued(client, running=1, queued=0)
        assert client.post("/v1/tts", json={"text": "y"}).status_code == 401
        assert client.post("/v1/tts", json={"text": "y"}, headers=bearer(KEY)).status_code == 503
        assert client.app.state.runtime.pool.stats()["running"] == 1
    finally:
        gate.set()
        first.join(10)


def test_keys_off_by_default_leaves_every_route_open(client):
    assert client.get("/v1/speakers").status_code == 200
    assert client.post("/v1/tts", json={"text": "hello"}).status_code == 200


def test_keys_are_never_logged(keyed, caplog):
    client = keyed()
    with caplog.at_level(logging.DEBUG):
        client.post("/v1/tts", json={"text": "hello"}, headers=bearer(KEY))
        client.post("/v1/tts", json={"text": "hello"}, headers={"X-API-Key": WRONG})
        client.get("/v1/speakers", params={"api_key": OTHER})
        with client.websocket_connect(f"/ws/echo?api_key={KEY}") as ws:
            ws.receive_json()
    server_side = [r for r in caplog.records if not r.name.startswith("httpx")]  # the test client logs its URLs
    text = "\n".join(record.getMessage() for record in server_side)
    assert "/v1/tts" in text  # the access log did run
    for key in (KEY, WRONG, OTHER):
        assert key not in text


def test_a_query_key_does_not_work_over_http(keyed):
    """Only WebSocket handshakes may carry ?api_key= (URLs end up in proxies' logs and browser history)."""
    assert keyed().get("/v1/speakers", params={"api_key": KEY}).status_code == 401


def test_websocket_without_a_key_is_refused_before_accept_with_401(keyed):
    client = keyed()
    with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect("/v1/audio/speech/echo"):
        pass
    response = denied.value
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="cosyserve"'
    assert response.json()["error"]["code"] == "missing_api_key"
    assert response.json()["error"]["type"] == "invalid_request_error"  # an OpenAI route: OpenAI's object


def test_websocket_with_a_wrong_key_is_refused(keyed):
    with pytest.raises(WebSocketDenialResponse) as denied, keyed().websocket_connect("/ws/echo?api_key=" + WRONG):
        pass
    assert denied.value.status_code == 401
    assert denied.value.json()["error"]["code"] == "invalid_api_key"


def test_websocket_key_in_the_query_is_taken_out_before_the_route(keyed):
    with keyed().websocket_connect(f"/ws/echo?lang=en&api_key={KEY}&x=1") as ws:
        assert ws.receive_json() == {"query": "lang=en&x=1"}


def test_websocket_key_in_a_header(keyed):
    with keyed().websocket_connect("/ws/echo?a=b", headers={"X-API-Key": OTHER}) as ws:
        assert ws.receive_json() == {"query": "a=b"}
        with pytest.raises(WebSocketDisconnect):
            ws.receive_json()


def test_websocket_without_denial_support_is_closed_with_1008():
    """A server without the websocket.http.response extension: close code 1008 before accept."""
    from app.api.auth import APIKeyMiddleware
    from tests.support.waiting import run

    sent: list[dict] = []

    async def app(scope, receive, send):  # never reached
        raise AssertionError("the route ran without a key")

    async def go() -> None:
        messages = [{"type": "websocket.connect"}]
        mw = APIKeyMiddleware(app, keys=[KEY])

        async def receive():
            return messages.pop(0)

        async def send(message):
            sent.append(message)

        await mw({"type": "websocket", "path": "/v1/audio/speech/stream", "headers": [], "query_string": b""},
                 receive, send)

    run(go())
    assert sent == [{"type": "websocket.close", "code": 1008, "reason": "missing_api_key"}]


def test_key_checker():
    checker = KeyChecker([KEY, OTHER])
    assert checker.valid(KEY) and checker.valid(OTHER)
    assert not checker.valid(WRONG) and not checker.valid("") and not checker.valid(KEY.upper())
    assert not KeyChecker([])
    assert not checker.valid("\udcff")  # undecodable header bytes are just wrong, not a crash


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_no_warning_on_loopback(host):
    assert is_loopback(host)
    assert exposure_warning(host, []) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "tts.example.com"])
def test_warning_when_exposed_without_keys(host):
    warning = exposure_warning(host, [])
    assert warning is not None and host in warning and "server.api_keys" in warning
    assert exposure_warning(host, [KEY]) is None


def test_server_logs_the_warning_at_startup(caplog):
    from app.server import warn_if_exposed

    with caplog.at_level(logging.WARNING, logger="cosyserve"):
        warn_if_exposed(Settings(dev={"fake_engine": True}, server={"host": "0.0.0.0"}))
        warn_if_exposed(Settings(dev={"fake_engine": True}, server={"host": "0.0.0.0", "api_keys": [KEY]}))
        warn_if_exposed(Settings(dev={"fake_engine": True}, server={"host": "127.0.0.1"}))
    assert [r.getMessage().split(",")[0] for r in caplog.records] == ["listening on 0.0.0.0"]
