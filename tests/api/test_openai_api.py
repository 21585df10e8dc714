"""OpenAI-compatible surface over the real pool with FakeEngines: formats, SSE, voices, errors."""

from __future__ import annotations

import struct
import threading
import warnings
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.api.openai_schemas import OPENAI_VOICES
from tests.support.decoding import CONTENT_TYPES, FORMATS, check_audio, expected_rate
from tests.support.fake_app import StubLibrary, duration_of, hold, wait_queued
from tests.support.sse import parse_sse, sse_audio

ERROR_KEYS = {"message", "type", "param", "code"}


def speech(client: TestClient, **body: Any):
    payload = {"model": "tts-1", "voice": "alloy", "input": "hello world", **body}
    return client.post("/v1/audio/speech", json=payload)


# -- audio ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [24000, 22050])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_decodes_at_the_right_rate_and_length(make_client, behaviour, fmt, rate):
    client = make_client(sample_rate=rate)
    r = speech(client, response_format=fmt)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == CONTENT_TYPES[fmt]
    assert int(r.headers["x-sample-rate"]) == expected_rate(fmt, rate)
    check_audio(r.content, fmt, rate, duration_of(behaviour))


def test_pcm_is_resampled_to_24k(make_client, behaviour):
    client = make_client(sample_rate=22050)
    r = speech(client, response_format="pcm")
    assert r.headers["x-sample-rate"] == "24000"
    want = 2 * round(duration_of(behaviour) * 24000)
    assert abs(len(r.content) - want) <= 2 * 4, (len(r.content), want)


def test_default_format_is_mp3(make_client, behaviour):
    r = make_client().post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": "hi"})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    check_audio(r.content, "mp3", 24000, duration_of(behaviour))


def test_wav_streams_with_unknown_length_header(make_client, behaviour):
    client = make_client()
    with client.stream("POST", "/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": "hi",
                                                          "response_format": "wav"}) as r:
        assert r.status_code == 200
        assert "content-length" not in r.headers
        body = b"".join(r.iter_bytes())
    assert struct.unpack("<I", body[4:8])[0] == 0xFFFFFFFF
    assert len(body) - 44 == 2 * behaviour.chunks * int(behaviour.chunk_s * 24000)


def test_speed_changes_the_length(make_client, behaviour):
    r = speech(make_client(), response_format="pcm", speed=2.0)
    assert len(r.content) == 2 * round(duration_of(behaviour, 2.0) * 24000)


@pytest.mark.parametrize("fmt", ["mp3", "pcm", "flac", "wav"])
@pytest.mark.parametrize("rate", [24000, 22050])
def test_sse_deltas_reassemble_to_the_audio(make_client, behaviour, seen, fmt, rate):
    client = make_client(sample_rate=rate)
    r = speech(client, response_format=fmt, stream_format="sse", input="Hello there, world. 你好")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    check_audio(sse_audio(events), fmt, rate, duration_of(behaviour))
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == 7  # Hello , there , world . 你 好 -> words, marks, CJK chars
    assert usage["output_tokens"] == round(duration_of(behaviour) * 25)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


# -- voices, models, instructions ----------------------------------------------------------------
def test_voice_as_string_object_and_openai_alias(make_client, seen):
    client = make_client()
    for voice, speaker in [("fake_male", "fake_male"), ({"id": "fake_male"}, "fake_male"),
                           ("alloy", "fake_female"), ("ash", "fake_male"), ({"id": "Nova"}, "fake_female")]:
        r = speech(client, voice=voice, response_format="pcm")
        assert r.status_code == 200, (voice, r.text)
        assert (seen[-1].mode, seen[-1].speaker) == ("sft", speaker), voice
    assert all(req.stream for req in seen)


def test_library_voice_and_instructions(make_client, seen):
    client = make_client()
    client.app.state.runtime.speech.library = StubLibrary("narrator", "alloy")
    r = speech(client, voice={"id": "narrator"}, response_format="pcm")
    assert r.status_code == 200 and "x-instructions-ignored" not in r.headers
    assert seen[-1].mode == "zero_shot" and seen[-1].voice == {"voice": "narrator"}
    r = speech(client, voice="narrator", instructions="Speak cheerfully.", response_format="pcm")
    assert r.status_code == 200 and "x-instructions-ignored" not in r.headers
    assert (seen[-1].mode, seen[-1].instruct_text) == ("instruct2", "Speak cheerfully.")
    speech(client, voice="alloy", response_format="pcm")  # a library voice named like an alias wins
    assert seen[-1].voice == {"voice": "alloy"}


def test_instructions_with_preset_use_instruct_mode(make_client, seen):
    r = speech(make_client(), voice="fake_female", instructions="whisper", response_format="pcm")
    assert r.status_code == 200 and "x-instructions-ignored" not in r.headers
    assert (seen[-1].mode, seen[-1].speaker, seen[-1].instruct_text) == ("instruct", "fake_female", "whisper")


def test_instructions_ignored_when_model_cannot_follow_them(make_client, seen):
    client = make_client(modes=("sft", "zero_shot", "cross_lingual"))
    r = speech(client, instructions="whisper", response_format="pcm")
    assert r.status_code == 200
    assert r.headers["x-instructions-ignored"] == "true"
    assert (seen[-1].mode, seen[-1].instruct_text) == ("sft", None)
    r = speech(client, instructions="   ", response_format="pcm")
    assert "x-instructions-ignored" not in r.headers


def test_openai_voice_name_without_presets_is_400(make_client):
    r = speech(make_client(speakers=()), voice="alloy")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "voice" and "OpenAI voice name" in err["message"]


def test_models_list_and_retrieve(make_client):
    client = make_client()
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    [card] = body["data"]
    assert set(card) == {"id", "object", "created", "owned_by"}
    assert (card["id"], card["object"], card["owned_by"]) == ("fake", "model", "cosyserve")
    assert isinstance(card["created"], int)
    for name in ("fake", "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "cosyvoice"):
        r = client.get(f"/v1/models/{name}")
        assert r.status_code == 200 and r.json()["id"] == name
        assert speech(client, model=name, response_format="pcm").status_code == 200
    r = client.get("/v1/models/whisper-1")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found" and set(r.json()["error"]) == ERROR_KEYS


def test_voices_lists_presets_library_and_aliases(make_client):
    client = make_client()
    client.app.state.runtime.speech.library = StubLibrary("narrator")
    body = client.get("/v1/audio/voices").json()
    assert body["object"] == "list"
    by_id = {v["id"]: v for v in body["data"]}
    assert by_id["fake_female"]["type"] == "preset" and by_id["narrator"]["type"] == "library"
    assert by_id["alloy"] == {"id": "alloy", "object": "voice", "type": "openai_alias", "speaker": "fake_female"}
    assert {v["id"] for v in body["data"] if v["type"] == "openai_alias"} == set(OPENAI_VOICES)
    # Open WebUI reads {"voices": [{"id", "name"}]}: the same ids, in the same order.
    assert [v["id"] for v in body["voices"]] == [v["id"] for v in body["data"]]
    named = {v["id"]: v["name"] for v in body["voices"]}
    assert (named["fake_female"], named["narrator"], named["alloy"]) == ("fake_female", "narrator", "alloy (fake_female)")


def test_audio_models_lists_what_model_accepts(make_client):
    client = make_client()
    body = client.get("/v1/audio/models").json()
    assert set(body) == {"models"}
    ids = [m["id"] for m in body["models"]]
    assert ids == ["fake", "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "cosyvoice"]
    assert all(set(m) == {"id", "name"} for m in body["models"])
    for name in ids:  # every listed id is a model /v1/audio/speech accepts
        assert speech(client, model=name, response_format="pcm").status_code == 200


# -- errors --------------------------------------------------------------------------------------
ERROR_CASES = [
    ({"response_format": "ogg"}, 400, "response_format"),
    ({"speed": 5}, 400, "speed"),
    ({"speed": 0.1}, 400, "speed"),
    ({"speed": "fast"}, 400, "speed"),
    ({"input": "a" * 4097}, 400, "input"),
    ({"input": ""}, 400, "input"),
    ({"input": "   "}, 400, "input"),
    ({"input": None}, 400, "input"),
    ({"voice": "nobody"}, 400, "voice"),
    ({"voice": {"name": "x"}}, 400, "voice"),
    ({"voice": ""}, 400, "voice"),
    ({"model": "gpt-5"}, 404, "model"),
    ({"model": None}, 400, "model"),
    ({"stream_format": "websocket"}, 400, "stream_format"),
]


@pytest.mark.parametrize("change,status,param", ERROR_CASES, ids=[f"{c[2]}-{i}" for i, c in enumerate(ERROR_CASES)])
def test_bad_requests_get_openai_errors(make_client, change, status, param):
    body = {"model": "tts-1", "voice": "alloy", "input": "hi"}
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    r = make_client().post("/v1/audio/speech", json=body)
    assert r.status_code == status, (change, r.text)
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error" and err["message"] and err["code"]


def test_input_of_exactly_4096_chars_is_fine(make_client):
    assert speech(make_client(), input="a" * 4096, response_format="pcm").status_code == 200


def test_malformed_json_is_400(make_client):
    r = make_client().post("/v1/audio/speech", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()["error"]) == ERROR_KEYS


def test_overload_is_503_in_openai_shape(make_client, behaviour):
    client = make_client(pool={"workers": 1, "max_queue": 1})
    gate = hold(behaviour)
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(speech(client, response_format="pcm").status_code))
               for _ in range(2)]
    for t in threads:
        t.start()
    wait_queued(client, running=1, queued=1)  # one runs, the other holds the only queue place
    r = speech(client, response_format="pcm")
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "overloaded" and set(r.json()["error"]) == ERROR_KEYS
    assert int(r.headers["retry-after"]) >= 1
    gate.set()
    for t in threads:
        t.join(10)
    assert results == [200, 200]


def test_draining_is_503(make_client):
    client = make_client()
    client.portal.call(client.app.state.runtime.pool.begin_drain)
    r = speech(client)
    assert r.status_code == 503 and r.json()["error"]["code"] == "draining"


def test_openapi_schema_builds_without_warnings(make_client):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = make_client().app.openapi()["paths"]
    assert {"/v1/audio/speech", "/v1/models", "/v1/audio/voices", "/v1/audio/models", "/inference_sft"} <= set(paths)


def test_sse_pcm_reassembles_exactly(make_client, behaviour):
    r = speech(make_client(), response_format="pcm", stream_format="sse")
    pcm = np.frombuffer(sse_audio(parse_sse(r.text)), dtype="<i2")
    assert len(pcm) == round(duration_of(behaviour) * 24000)
