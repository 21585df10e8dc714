"""The speech WebSocket's protocol from the client side, over a TestClient session."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

PATH = "/v1/audio/speech/stream"


def in_flight(client: TestClient) -> int:
    return client.app.state.runtime.pool.stats()["in_flight"]


def send(ws, type_: str, **fields) -> None:
    ws.send_text(json.dumps({"type": type_, **fields}))


def utterance(ws) -> tuple[dict, bytes, dict]:
    """(audio.start, the audio bytes, audio.done) of the next utterance; fails on an error event."""
    start, audio = None, bytearray()
    while True:
        m = ws.receive()
        if m.get("bytes") is not None:
            assert start is not None, "audio before audio.start"
            audio += m["bytes"]
            continue
        event = json.loads(m["text"])
        assert event["type"] != "error", event
        if event["type"] == "audio.start":
            start = event
        elif event["type"] == "audio.done":
            return start, bytes(audio), event


def error(ws) -> dict:
    event = ws.receive_json()
    assert event["type"] == "error", event
    return event["error"]


def closed(ws) -> int:
    with pytest.raises(WebSocketDisconnect) as exc:
        while True:
            m = ws.receive()
            if m["type"] == "websocket.close":
                raise WebSocketDisconnect(m["code"], m.get("reason"))
    return exc.value.code
