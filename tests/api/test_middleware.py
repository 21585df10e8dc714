"""RequestContextMiddleware: request ids, the typed context, on_done on every path, the access log."""

from __future__ import annotations

import asyncio
import logging

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app.api.context import RequestContext, context_of, request_id
from app.middleware import RequestContextMiddleware


def make(done: list[RequestContext]) -> TestClient:
    async def ok(request):
        context_of(request.scope).audio_s = 1.5
        return PlainTextResponse("ok")

    async def boom(request):
        raise RuntimeError("handler failed")

    async def stream(request):
        async def body():
            yield b"a"
            yield b"b"
        return StreamingResponse(body())

    app = Starlette(routes=[Route("/ok", ok), Route("/boom", boom), Route("/stream", stream),
                            Route("/health/live", ok)])
    app = RequestContextMiddleware(app, access_log=True, on_done=done.append)
    return TestClient(app, raise_server_exceptions=False)


def test_request_id_is_echoed_when_valid_and_generated_otherwise():
    done: list[RequestContext] = []
    client = make(done)
    assert client.get("/ok", headers={"X-Request-ID": "abc.1:2-3"}).headers["x-request-id"] == "abc.1:2-3"
    for bad in ("", "has space", "x" * 129, "semi;colon"):
        rid = client.get("/ok", headers={"X-Request-ID": bad}).headers["x-request-id"]
        assert len(rid) == 32 and rid != bad
    assert [c.request_id for c in done][0] == "abc.1:2-3"


def test_one_request_id_rule():
    assert request_id("abc.1:2-3") == "abc.1:2-3" and request_id("x" * 128) == "x" * 128
    for bad in (None, "", "has space", "x" * 129, "semi;colon", "ünï"):
        rid = request_id(bad)
        assert len(rid) == 32 and rid != bad and request_id(rid) == rid


def test_on_done_gets_the_context_on_every_path():
    done: list[RequestContext] = []
    client = make(done)
    client.get("/ok")
    assert client.get("/boom").status_code == 500
    assert client.get("/stream").text == "ab"
    assert [(c.status, c.completed) for c in done] == [(200, True), (500, True), (200, True)]
    assert done[0].audio_s == 1.5 and all(c.latency_s is not None and c.latency_s >= 0 for c in done)


def test_one_access_log_line_per_request_but_not_for_probes(caplog):
    done: list[RequestContext] = []
    client = make(done)
    with caplog.at_level(logging.INFO, logger="cosyserve.access"):
        client.get("/ok", headers={"X-Request-ID": "line-1"})
        client.get("/health/live")
    lines = [r.getMessage() for r in caplog.records if r.name == "cosyserve.access"]
    assert len(lines) == 1 and lines[0].startswith("line-1 GET /ok 200") and "audio=1.50s" in lines[0]


@pytest.mark.parametrize("scope_type", ["lifespan", "websocket"])
def test_non_http_scopes_pass_through(scope_type):
    seen = []

    async def inner(scope, receive, send):
        seen.append(scope)

    import asyncio

    asyncio.run(RequestContextMiddleware(inner)({"type": scope_type}, None, None))
    assert seen == [{"type": scope_type}]


def test_a_client_that_left_before_any_answer_is_logged_499_not_500():
    done: list[RequestContext] = []

    async def leaves(scope, receive, send):  # the edge's path when the body never completes
        context_of(scope).error_code = "client_closed_request"

    async def crashes(scope, receive, send):  # no answer for another reason: still a 500
        pass

    for app, status in ((leaves, 499), (crashes, 500)):
        mw = RequestContextMiddleware(app, access_log=False, on_done=done.append)

        async def noop(message=None):
            return {"type": "http.disconnect"}

        asyncio.run(mw({"type": "http", "method": "POST", "path": "/v1/tts", "headers": []}, noop, noop))
        assert done[-1].status == status
