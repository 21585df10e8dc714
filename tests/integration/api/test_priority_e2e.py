"""Traffic classes end to end: bulk requests through a real `cosyserve serve` (uvicorn) on tiny CosyVoice2.

A key whose keys-file line says ``priority=bulk``, a body field, the ``X-Priority`` header and a
WebSocket ``session.config``: each bulk request completes with audio, and the access log names its class.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from tests.support.server import ServerProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

LIVE_KEY = "sk-live-Tb6Np2Wq8Zc4"
BULK_KEY = "sk-bulk-Mh3Rx7Jd1Ks5"


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("priority-e2e")
    keys_file = tmp / "keys.txt"
    keys_file.write_text(f"{LIVE_KEY}\n{BULK_KEY} priority=bulk\n")
    config = {
        "engine": {"model_dir": str(tiny_models(2)), "torch_threads": 1},
        "server": {"api_keys_file": str(keys_file), "drain_timeout_s": 30},
        "voices": {"dir": str(tmp / "voices")},
    }
    with ServerProcess(tmp, config) as srv:
        yield srv


def pcm(server: ServerProcess, key: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/tts", json={"format": "pcm", "stream": True, **body},
                      headers={"Authorization": f"Bearer {key}", **(headers or {})}, timeout=120)


def test_bulk_requests_complete_by_key_body_and_header(server):
    answers = [pcm(server, BULK_KEY, {"text": "Bulk by key."}),
               pcm(server, LIVE_KEY, {"text": "Bulk by body.", "priority": "bulk"}),
               pcm(server, LIVE_KEY, {"text": "Bulk by header."}, {"X-Priority": "bulk"}),
               pcm(server, BULK_KEY, {"text": "Live by body.", "priority": "interactive"})]
    for r in answers:
        assert r.status_code == 200, r.text
        assert len(r.content) > 0.05 * 2 * int(r.headers["X-Sample-Rate"])
    assert [r.headers["X-Priority"] for r in answers] == ["bulk", "bulk", "bulk", "interactive"]

    def logged() -> bool:  # each line is written once its response is done, which may be after we read it
        lines = [line for line in server.log().splitlines() if "POST /v1/tts 200" in line]
        return sum(" class=bulk" in line for line in lines) >= 3 and any(" class=interactive" in line for line in lines)

    wait_until(logged, timeout=10, poll_s=0.1)
    assert BULK_KEY not in server.log()


def test_a_bulk_websocket_session_speaks(server):
    async def session() -> tuple[int, dict]:
        url = server.base_url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        audio = 0
        async with websockets.connect(url, additional_headers={"X-API-Key": LIVE_KEY}) as ws:
            await ws.send(json.dumps({"type": "session.config", "priority": "bulk"}))
            await ws.send(json.dumps({"type": "input.text", "text": "A bulk utterance."}))
            await ws.send(json.dumps({"type": "session.close"}))
            async for message in ws:
                if isinstance(message, bytes):
                    audio += len(message)
                    continue
                event = json.loads(message)
                assert event["type"] != "error", event
                if event["type"] == "session.done":
                    return audio, event
        raise AssertionError("the session ended without session.done")

    audio, done = asyncio.run(asyncio.wait_for(session(), 120))
    assert audio > 0 and done["utterances"] == 1
    # the session's line is written as the socket closes, after session.done reached us
    wait_until(lambda: "WS /v1/audio/speech/stream class=bulk" in server.log(), timeout=10, poll_s=0.1)
