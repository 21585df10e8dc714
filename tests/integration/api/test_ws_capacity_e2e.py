"""WebSocket sessions that compute nothing hold no synthesis capacity: a real server, tiny CosyVoice2.

One synthesis permit in all (``pool.admission: fixed``, one worker, no queue). Sessions that
only configure count against ``websocket.max_sessions`` and never against that permit, so an
HTTP request beside them is served; the session past the limit is refused with close 1013
through real uvicorn; bad messages of every kind leave the session open, and a frame over the
transport's cap is cut off; sessions that send no text reach the idle timeout.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.support.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

IDLE_S = 4.0


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ws-capacity-e2e")
    cfg = {"engine": {"model_dir": str(tiny_models(2)), "torch_threads": 1},
           "pool": {"workers": 1, "max_queue": 0, "admission": "fixed", "request_timeout_s": 120},
           "server": {"drain_timeout_s": 10},
           "websocket": {"max_sessions": 3, "idle_timeout_s": IDLE_S, "max_message_bytes": 4096},
           "voices": {"dir": str(tmp / "voices")}}
    with ServerProcess(tmp, cfg) as srv:
        yield srv


def url(srv: ServerProcess) -> str:
    return f"ws://127.0.0.1:{srv.port}/v1/audio/speech/stream"


def next_event(ws) -> dict:
    while True:
        m = ws.recv(timeout=60)
        if isinstance(m, str):
            return json.loads(m)


def close_code(ws) -> int | None:
    with pytest.raises(ConnectionClosed) as exc:
        while True:
            ws.recv(timeout=60)
    return exc.value.rcvd.code if exc.value.rcvd is not None else None


def refused_total(srv: ServerProcess) -> float:
    for line in httpx.get(srv.base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith('tts_ws_sessions_refused_total{reason="session_limit"}'):
            return float(line.split()[-1])
    raise AssertionError("no tts_ws_sessions_refused_total series")


def test_idle_sessions_hold_no_permit_and_the_one_past_the_limit_gets_1013(server):
    before = refused_total(server)
    with ExitStack() as stack:
        sessions = [stack.enter_context(connect(url(server), open_timeout=30)) for _ in range(3)]
        for ws in sessions:
            ws.send(json.dumps({"type": "session.config", "response_format": "pcm"}))
        with connect(url(server), open_timeout=30) as extra:
            event = next_event(extra)
            assert event["type"] == "error" and event["error"]["code"] == "session_limit"
            assert close_code(extra) == 1013
        assert refused_total(server) == before + 1
        # the only synthesis permit is free: three sessions hold none
        r = httpx.post(server.base_url + "/v1/tts", json={"text": "Served beside idle sessions.", "format": "pcm"},
                       timeout=120)
        assert r.status_code == 200 and len(r.content) > 0

        ws = sessions[0]
        for bad in ("[" * 3000, json.dumps({"type": "input.text", "text": "x" * 5000}),
                    '{"type": "input.text", "text": "lone \\ud800"}', "not json"):
            ws.send(bad)
            event = next_event(ws)
            assert event["type"] == "error" and event["error"]["code"] in ("invalid_message", "invalid_input"), event
        ws.send(json.dumps({"type": "input.text", "text": "Still open."}))
        ws.send(json.dumps({"type": "input.done"}))
        kinds = []
        while not kinds or kinds[-1] != "audio.done":
            kinds.append(next_event(ws)["type"])
        assert kinds == ["audio.start", "audio.done"]

        big = sessions[1]
        big.send(json.dumps({"type": "input.text", "text": "y" * (2 * 1024 * 1024)}))  # over the 1 MiB transport cap
        assert close_code(big) == 1009


def test_a_session_that_only_configures_reaches_the_idle_timeout(server):
    with connect(url(server), open_timeout=30) as ws:
        started = time.monotonic()
        events: list[dict] = []
        while time.monotonic() - started < 3 * IDLE_S:
            try:
                ws.send(json.dumps({"type": "session.config", "response_format": "pcm"}))
                m = ws.recv(timeout=1.0)
            except TimeoutError:
                continue
            except ConnectionClosed as exc:
                assert exc.rcvd is not None and exc.rcvd.code == 1000
                break
            if isinstance(m, str):
                events.append(json.loads(m))
        elapsed = time.monotonic() - started
    assert [e["error"]["code"] for e in events] == ["idle_timeout"]
    assert IDLE_S - 0.5 <= elapsed < IDLE_S + 3
