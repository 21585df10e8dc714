"""The traffic class on every surface (issue 39): body field, X-Priority, the API key's default, precedence.

The class reaches the pool (``pool.gate.admit``), the engine's request, the access log and the schema.
"""

from __future__ import annotations

import json
import logging

import pytest
from fastapi.testclient import TestClient

from app.api.auth import key_id
from app.main import create_app
from app.serving.admission.classes import Priority
from app.settings import Settings
from tests.support.fake_app import RecordingEngine
from tests.support.sounds import prompt_wav
from tests.support.sse import parse_sse

KEY, BULK_KEY = "k-live-0123456789", "k-bulk-0123456789"


@pytest.fixture
def client(make_client, monkeypatch):
    """A started client over RecordingEngines; ``client.calls``: the (class, client) of each ``gate.admit``."""
    c = make_client()
    pool = c.app.state.runtime.pool
    calls: list = []
    admit = pool.gate.admit

    async def record(priority, who=""):
        calls.append((priority, who))
        return await admit(priority, who)

    monkeypatch.setattr(pool.gate, "admit", record)
    c.calls = calls
    return c


def test_json_body_field_reaches_the_pool_and_the_engine(client, seen):
    r = client.post("/v1/tts", json={"text": "Hello.", "priority": "bulk"})
    assert r.status_code == 200 and r.headers["X-Priority"] == "bulk"  # the class it ran in
    assert client.calls == [(Priority.BULK, "testclient")] and seen[-1].priority == "bulk"
    r = client.post("/v1/tts", json={"text": "Hello."})
    assert r.status_code == 200 and client.calls[-1][0] is Priority.INTERACTIVE
    assert r.headers["X-Priority"] == "interactive"
    assert seen[-1].priority == "interactive"


def test_native_multipart_form_field(client, seen):
    r = client.post("/v1/tts", data={"text": "Hello.", "priority": "BULK", "prompt_text": "hi"},
                    files={"prompt_audio": ("priority.wav", prompt_wav(), "audio/wav")})
    assert r.status_code == 200, r.text
    assert client.calls[-1][0] is Priority.BULK and seen[-1].priority == "bulk"


def test_openai_speech_and_its_sse(client, seen):
    body = {"model": "tts-1", "input": "Hello.", "voice": "alloy", "priority": "bulk"}
    assert client.post("/v1/audio/speech", json=body).status_code == 200
    assert seen[-1].priority == "bulk"
    r = client.post("/v1/audio/speech", json={**body, "stream_format": "sse"})
    assert r.status_code == 200 and parse_sse(r.text)[-1]["type"] == "speech.audio.done"
    assert [c[0] for c in client.calls] == [Priority.BULK, Priority.BULK]


def test_upstream_routes_take_it_as_a_form_field_or_a_query_field(client, seen):
    r = client.post("/inference_sft", data={"tts_text": "Hello.", "spk_id": "fake_male", "priority": "bulk"})
    assert r.status_code == 200 and seen[-1].priority == "bulk"
    r = client.get("/inference_sft", params={"tts_text": "Hello.", "spk_id": "fake_male", "priority": "bulk"})
    assert r.status_code == 200 and seen[-1].priority == "bulk"
    r = client.post("/inference_cross_lingual", data={"tts_text": "Hello.", "priority": "bulk"},
                    files={"prompt_wav": ("a.wav", prompt_wav(), "audio/wav")})
    assert r.status_code == 200 and seen[-1].priority == "bulk"
    r = client.get("/inference_sft", params={"tts_text": "Hello.", "spk_id": "fake_male"})
    assert r.status_code == 200 and seen[-1].priority == "interactive"


@pytest.mark.parametrize("method,path,body,status", [
    ("json", "/v1/tts", {"text": "Hello."}, 422),
    ("json", "/v1/audio/speech", {"model": "tts-1", "input": "Hello.", "voice": "alloy"}, 400),
    ("form", "/inference_sft", {"tts_text": "Hello.", "spk_id": "fake_male"}, 422),
])
def test_an_unknown_class_in_the_body_is_the_surfaces_field_error(client, seen, method, path, body, status):
    sent = {**body, "priority": "urgent"}
    r = client.post(path, json=sent) if method == "json" else client.post(path, data=sent)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == "validation_error" and "priority" in error["message"] and not seen
    if path.startswith("/v1/audio"):
        assert error["param"] == "priority"


def test_header_names_the_class_and_the_body_wins_over_it(client, seen):
    r = client.post("/v1/tts", json={"text": "Hello."}, headers={"X-Priority": "bulk"})
    assert r.status_code == 200 and seen[-1].priority == "bulk"
    r = client.post("/v1/tts", json={"text": "Hello.", "priority": "interactive"}, headers={"X-Priority": "bulk"})
    assert r.status_code == 200 and seen[-1].priority == "interactive"


def test_an_unknown_header_is_400_before_any_permit(client, seen):
    r = client.post("/v1/tts", json={"text": "Hello."}, headers={"X-Priority": "urgent"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_priority"
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "alloy"},
                    headers={"X-Priority": "soon"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Priority"
    assert not client.calls and not seen


def test_access_log_names_the_class_of_synthesis_requests(client, caplog):
    with caplog.at_level(logging.INFO, logger="cosyserve.access"):
        client.post("/v1/tts", json={"text": "Hello.", "priority": "bulk"})
        client.post("/v1/tts", json={"text": "Hello."})
        client.get("/v1/speakers")
    lines = [r.getMessage() for r in caplog.records if r.name == "cosyserve.access"]
    assert " class=bulk" in lines[0] and " class=interactive" in lines[1] and "class=" not in lines[2]


def test_openapi_documents_the_field_and_the_header(client):
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    assert set(components["Priority"]["enum"]) == {"interactive", "bulk"}
    assert "priority" in components["TTSRequest"]["properties"]
    assert "priority" in components["SpeechRequest"]["properties"]
    for path, method in (("/v1/tts", "post"), ("/v1/audio/speech", "post"), ("/inference_sft", "get"),
                         ("/inference_zero_shot", "post")):
        names = [p["name"] for p in schema["paths"][path][method].get("parameters", [])]
        assert "X-Priority" in names, (path, method)
    form = schema["paths"]["/inference_sft"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert "priority" in form["properties"]


# -- API keys: a default class per key -----------------------------------------------------------------
@pytest.fixture
def keyed(tmp_path, behaviour, seen):
    keys = tmp_path / "keys"
    keys.write_text(f"# live and bulk\n{KEY}\n{BULK_KEY}   priority=bulk\n")
    settings = Settings(dev={"fake_engine": True}, voices={"dir": str(tmp_path / "voices")},
                        server={"access_log": True, "drain_timeout_s": 5, "api_keys_file": str(keys)})
    with TestClient(create_app(settings, engine_factory=lambda i: RecordingEngine(behaviour, seen))) as client:
        yield client


def test_a_keys_default_class_and_what_overrides_it(keyed, seen, monkeypatch):
    pool = keyed.app.state.runtime.pool
    calls: list = []
    admit = pool.gate.admit

    async def record(priority, who=""):
        calls.append((priority, who))
        return await admit(priority, who)

    monkeypatch.setattr(pool.gate, "admit", record)
    auth = {"Authorization": f"Bearer {BULK_KEY}"}
    assert keyed.post("/v1/tts", json={"text": "Hi."}, headers=auth).status_code == 200
    assert seen[-1].priority == "bulk" and calls[-1] == (Priority.BULK, key_id(BULK_KEY))
    assert BULK_KEY not in calls[-1][1]  # the key's id, never the key
    assert keyed.post("/v1/tts", json={"text": "Hi."}, headers={**auth, "X-Priority": "interactive"}).status_code == 200
    assert seen[-1].priority == "interactive"
    assert keyed.post("/v1/tts", json={"text": "Hi.", "priority": "interactive"}, headers=auth).status_code == 200
    assert seen[-1].priority == "interactive"
    assert keyed.post("/v1/tts", json={"text": "Hi."}, headers={"X-API-Key": KEY}).status_code == 200
    assert seen[-1].priority == "interactive" and calls[-1] == (Priority.INTERACTIVE, key_id(KEY))


def test_a_websocket_with_a_bulk_key_speaks_as_bulk(keyed, seen):
    with keyed.websocket_connect(WS, headers={"X-API-Key": BULK_KEY}) as ws:
        assert speak(ws, "Hello.")["utterances"] == 1
    assert seen[-1].priority == "bulk"


# -- WebSocket: session.config and the handshake's header -------------------------------------------------
WS = "/v1/audio/speech/stream"


def speak(ws, text: str, **config) -> dict:
    """Configure (if asked), speak ``text``, close; the session.done event."""
    if config:
        ws.send_text(json.dumps({"type": "session.config", **config}))
    ws.send_text(json.dumps({"type": "input.text", "text": text}))
    ws.send_text(json.dumps({"type": "session.close"}))
    while True:
        message = ws.receive()
        event = json.loads(message["text"]) if message.get("text") else {}
        assert event.get("type") != "error", event
        if event.get("type") == "session.done":
            return event


def test_session_config_names_the_class_of_its_utterances(client, seen):
    with client.websocket_connect(WS) as ws:
        speak(ws, "Hello.", priority="bulk")
    assert seen[-1].priority == "bulk" and client.calls == [(Priority.BULK, "testclient")]


def test_the_handshakes_header_is_the_sessions_default(client, seen):
    with client.websocket_connect(WS, headers={"X-Priority": "bulk"}) as ws:
        speak(ws, "Hello.")
    assert seen[-1].priority == "bulk"
    with client.websocket_connect(WS, headers={"X-Priority": "bulk"}) as ws:
        speak(ws, "Hello.", priority="interactive")
    assert seen[-1].priority == "interactive"


def test_an_unknown_class_on_a_websocket(client, seen):
    with client.websocket_connect(WS) as ws:
        ws.send_text(json.dumps({"type": "session.config", "priority": "urgent"}))
        error = ws.receive_json()["error"]
        assert error["code"] == "invalid_message" and error["param"] == "priority"
    with client.websocket_connect(WS, headers={"X-Priority": "urgent"}) as ws:
        assert ws.receive_json()["error"]["code"] == "invalid_priority"
        assert ws.receive()["code"] == 1008
    assert not seen
