"""No API key in any log line at log_level debug, uvicorn's own handshake lines included.

A real `cosyserve serve` on tiny CosyVoice2 at ``server.log_level: debug`` with keys on.
Keys go every way a client sends one: ``Authorization: Bearer``, ``X-API-Key`` and (for
WebSocket handshakes) ``?api_key=``, over HTTP and WebSocket, valid and wrong. The log
must show that uvicorn did log those requests at debug (masked), and hold no key.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from tests.support.server import ServerProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

KEY = "sk-redact-Wd3Kp9Qx7Mv2"
FILE_KEY = "sk-redact-file-Hc5Tn1Zb8Ry4"
WRONG = "sk-redact-wrong-Lf6Gs2Ju0Ne3"


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("redact-e2e")
    keys_file = tmp / "keys.txt"
    keys_file.write_text(f"{FILE_KEY}\n")
    config = {
        "engine": {"model_dir": str(tiny_models(2)), "torch_threads": 1},
        "pool": {"workers": 1, "queue_timeout_s": 60, "request_timeout_s": 120},
        "server": {"api_keys": [KEY], "api_keys_file": str(keys_file), "log_level": "debug",
                   "drain_timeout_s": 10},
        "voices": {"dir": str(tmp / "voices")},
    }
    with ServerProcess(tmp, config) as srv:
        yield srv


def ws_session(url: str, headers: dict | None = None) -> int | list[dict]:
    """The events of one short session (one utterance, then session.close), or the refused status."""
    async def run() -> int | list[dict]:
        try:
            async with websockets.connect(url, additional_headers=headers, open_timeout=30) as ws:
                await ws.send(json.dumps({"type": "input.text", "text": "Hi."}))
                await ws.send(json.dumps({"type": "session.close"}))
                events = []
                async for message in ws:
                    if isinstance(message, str):
                        events.append(json.loads(message))
                return events
        except InvalidStatus as exc:
            return exc.response.status_code

    return asyncio.run(run())


def test_no_key_reaches_the_log_at_debug_level_by_any_way_of_sending_it(server):
    base = server.base_url
    ws_url = base.replace("http://", "ws://") + "/v1/audio/speech/stream"
    for key in (KEY, FILE_KEY):
        with httpx.Client(base_url=base, timeout=120) as http:
            assert http.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
            r = http.post("/v1/tts", headers={"X-API-Key": key}, json={"text": "Hello.", "format": "pcm"})
            assert r.status_code == 200 and len(r.content) > 0
            assert http.get(f"/v1/models?api_key={key}").status_code == 401  # only handshakes may
        for url, headers in ((f"{ws_url}?api_key={key}", None), (ws_url, {"X-API-Key": key}),
                             (ws_url, {"Authorization": f"Bearer {key}"})):
            events = ws_session(url, headers)
            assert isinstance(events, list) and events[-1]["type"] == "session.done", events
    assert httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {WRONG}"}).status_code == 401
    assert ws_session(f"{ws_url}?api_key={WRONG}") == 401
    assert ws_session(ws_url, {"X-API-Key": WRONG}) == 401

    def whole_log() -> str:  # all of it (server.log() keeps only the tail)
        return server.log_path.read_text(errors="replace")

    wait_until(lambda: "authorization: ***" in whole_log().lower(), timeout=10)
    log = whole_log()
    # uvicorn logged the handshakes at debug: the lines are there, masked
    assert "DEBUG" in log
    assert "api_key=*** HTTP/1.1" in log
    assert "x-api-key: ***" in log.lower()
    assert "authorization: ***" in log.lower()
    for key in (KEY, FILE_KEY, WRONG):
        assert key not in log
        assert key[-8:] not in log  # not even a part of one
