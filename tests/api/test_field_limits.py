"""Every input bounded at the edge: each text field of each HTTP surface has a limit and a clear 4xx.

A giant field is refused before any engine work (the RecordingEngine sees nothing), the
error body quotes at most a short prefix of what was sent, and a lone surrogate is
``invalid_input`` everywhere. Over the real app and pool with FakeEngines.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time

import pytest

from app.engines.base import SynthesisRequest
from app.serving.bounds import (
    INSTRUCTIONS_MAX_CHARS,
    NAME_MAX_CHARS,
    PROMPT_TEXT_MAX_CHARS,
    quoted,
)
from app.serving.plan import SpeechFields, check_fields
from app.serving.speech import OVERHEAD_CHARS, request_size
from tests.support import configs
from tests.support.sounds import prompt_wav

MB = 1024 * 1024
BIG = "x" * MB
# Big enough to be absurd for any field, small enough that the body (JSON or a urlencoded form, no uploaded
# audio) stays within what the edge reads of such a body (8 bytes a character of max_text_chars + 64 KB), so
# the schema's own caps answer; a 1 MB one is refused by the edge before it is read (413).
LARGE = 50_000


def refused(r, status: int, sent: str = BIG) -> dict:
    """The error object of a refusal that does not echo ``sent`` back."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert len(r.content) < 1000, len(r.content)
    assert sent[:QUOTE_LIMIT + 1] not in r.text
    return r.json()["error"]


QUOTE_LIMIT = 40


@pytest.fixture
def client(make_client):
    return make_client(pool={"workers": 2, "max_queue": 2})


@pytest.mark.parametrize("field", ["prompt_text", "instruct_text", "voice", "speaker"])
def test_native_json_fields_over_their_cap_are_refused_at_once(client, seen, field):
    started = time.monotonic()
    r = client.post("/v1/tts", json={"text": "Hello.", field: "x" * LARGE})
    elapsed = time.monotonic() - started
    err = refused(r, 422, "x" * LARGE)
    assert err["code"] == "validation_error" and field in err["message"]
    assert elapsed < 5  # schema work only (the goal, < 100 ms, is measured by the benchmark)
    assert seen == []


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/tts", {"text": "Hello.", "prompt_text": BIG}),
    ("/v1/tts", {"text": "Hello.", "instruct_text": BIG}),
    ("/v1/audio/speech", {"model": "tts-1", "input": "Hello.", "voice": "alloy", "instructions": BIG}),
    ("/v1/audio/speech", {"model": BIG, "input": "Hello.", "voice": "alloy"}),
])
def test_a_giant_json_field_is_refused_before_its_body_is_read(client, seen, path, body):
    err = refused(client.post(path, json=body), 413)
    assert err["code"] == "payload_too_large" and "server.max_text_chars" in err["message"]
    assert seen == []


@pytest.mark.parametrize("field", ["prompt_text", "instruct_text", "voice"])
def test_native_multipart_fields_over_their_cap_are_refused(client, seen, field):
    r = client.post("/v1/tts", data={"text": "Hello.", field: "y" * 200_000},
                    files={"prompt_audio": ("p.wav", prompt_wav(), "audio/wav")})
    err = refused(r, 422, "y" * 200_000)
    assert field in err["message"]
    assert seen == []


def test_native_fields_at_their_cap_are_accepted(client, seen):
    r = client.post("/v1/tts", json={"text": "Hello.", "prompt_text": "p" * PROMPT_TEXT_MAX_CHARS,
                                     "instruct_text": "i" * INSTRUCTIONS_MAX_CHARS, "voice": "fake_male"})
    assert r.status_code == 200, r.text
    assert len(seen) == 1


@pytest.mark.parametrize(("body", "param"), [
    ({"instructions": "x" * LARGE}, "instructions"),
    ({"model": "x" * LARGE}, "model"),
    ({"voice": "v" * LARGE}, "voice"),
    ({"voice": {"id": "v" * LARGE}}, "voice"),
    ({"response_format": "x" * LARGE}, "response_format"),
    ({"stream_format": "x" * LARGE}, "stream_format"),
    ({"input": "x" * LARGE}, "input"),
])
def test_openai_fields_over_their_cap_get_400_without_the_input_echoed(client, seen, body, param):
    payload = {"model": "tts-1", "input": "Hello.", "voice": "alloy", **body}
    r = client.post("/v1/audio/speech", json=payload)
    err = refused(r, 400, json.dumps(body)[12:])
    assert err["param"] == param or param in err["message"]
    assert seen == []


def test_an_unknown_model_or_voice_is_quoted_by_a_short_prefix(client):
    r = client.post("/v1/audio/speech", json={"model": "m" * NAME_MAX_CHARS, "input": "Hi.", "voice": "alloy"})
    err = refused(r, 404, "m" * NAME_MAX_CHARS)
    assert err["code"] == "model_not_found" and f"({NAME_MAX_CHARS} characters)" in err["message"]
    r = client.post("/v1/tts", json={"text": "Hi.", "voice": "n" * NAME_MAX_CHARS})
    err = refused(r, 400, "n" * NAME_MAX_CHARS)
    assert err["code"] == "unknown_voice" and err["message"].startswith("unknown voice 'nnnn")


@pytest.mark.parametrize(("path", "fields"), [
    ("/inference_sft", {"spk_id": "s" * 100_000}),
    ("/inference_instruct", {"spk_id": "fake_male", "instruct_text": "i" * 100_000}),
    ("/inference_instruct2", {"instruct_text": "i" * 100_000}),
    ("/inference_zero_shot", {"prompt_text": "p" * 100_000}),
])
@pytest.mark.parametrize("how", ["form", "query"])
def test_upstream_fields_over_their_cap_are_refused(client, seen, path, fields, how):
    data = {"tts_text": "Hello.", **fields}
    if how == "form":
        files = {"prompt_wav": ("p.wav", prompt_wav(), "audio/wav")}
        r = client.post(path, data=data, files=files)
    else:
        if len(json.dumps(data)) > 60_000:  # a URL this long is refused by HTTP servers first; keep it valid
            data = {k: v[:5000] if len(v) > 5000 else v for k, v in data.items()}
        r = client.get(path, params=data)
    assert r.status_code in (400, 422), r.text[:300]
    assert len(r.content) < 1000
    assert seen == []


def test_a_lone_surrogate_is_invalid_input_on_every_http_surface(client, seen):
    body = b'{"text": "broken \\ud800 text"}'
    r = client.post("/v1/tts", content=body, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_input"), r.text
    body = b'{"model": "tts-1", "voice": "alloy", "input": "broken \\udc00"}'
    r = client.post("/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_input"), r.text
    assert seen == []


def test_the_planner_bounds_every_field_whatever_the_surface_schema_says():
    limits = configs.speech_limits(max_text_chars=50)
    for fields, param in ((SpeechFields(text="t" * 51), "text"),
                          (SpeechFields(text="ok", prompt_text="p" * (PROMPT_TEXT_MAX_CHARS + 1)), "prompt_text"),
                          (SpeechFields(text="ok", instructions="i" * (INSTRUCTIONS_MAX_CHARS + 1),
                                        instructions_param="instruct_text"), "instruct_text"),
                          (SpeechFields(text="ok", voice="v" * (NAME_MAX_CHARS + 1), voice_param="spk_id"), "spk_id"),
                          (SpeechFields(text="a\ud800"), "text"),
                          (SpeechFields(text="ok", prompt_text="\udc00"), "prompt_text")):
        with pytest.raises(Exception) as exc:
            check_fields(fields, limits)
        assert exc.value.param == param, (param, exc.value.message)
        assert exc.value.code in ("text_too_long", "field_too_long", "invalid_input")
    check_fields(SpeechFields(text="t" * 50, prompt_text="p" * PROMPT_TEXT_MAX_CHARS), limits)


def test_quoted_cuts_long_values_and_says_their_length():
    assert quoted("short") == "'short'"
    long = quoted("z" * 10_000)
    assert long.startswith("'" + "z" * QUOTE_LIMIT + "'...") and "(10000 characters)" in long and len(long) < 80


def test_admission_weighs_a_request_by_all_the_text_it_processes():
    req = SynthesisRequest(text="a" * 100, mode="zero_shot", prompt_text="b" * 300, instruct_text="c" * 50)
    assert request_size(req) == 100 + 300 + 50 + OVERHEAD_CHARS
    assert request_size(SynthesisRequest(text="a" * 100, mode="sft")) == 100 + OVERHEAD_CHARS


def test_voice_registration_fields_are_bounded(make_client, tmp_path):
    client = make_client()
    wav = prompt_wav()
    r = client.post("/v1/voices", data={"name": "n" * 100_000, "transcript": "hello"},
                    files={"audio": ("a.wav", wav, "audio/wav")})
    assert refused(r, 400, "n" * 100_000)["code"] == "invalid_name"
    r = client.post("/v1/voices", data={"name": "alice", "transcript": "t" * (PROMPT_TEXT_MAX_CHARS + 1)},
                    files={"audio": ("a.wav", wav, "audio/wav")})
    assert refused(r, 400, "t" * (PROMPT_TEXT_MAX_CHARS + 1))["code"] == "invalid_transcript"
    r = client.post("/v1/voices", data={"name": "alice", "transcript": "hello", "description": "d" * 5000},
                    files={"audio": ("a.wav", wav, "audio/wav")})
    assert refused(r, 400, "d" * 5000)["code"] == "invalid_description"
    r = client.get("/v1/voices/" + "q" * 5000)
    assert refused(r, 404, "q" * 5000)["code"] == "voice_not_found"
    r = client.delete("/v1/voices/" + "q" * 5000)
    assert refused(r, 404, "q" * 5000)["code"] == "voice_not_found"
    assert client.get("/v1/voices").json()["voices"] == []


def test_a_full_voices_disk_is_507_and_nothing_half_written_remains(make_client, tmp_path, monkeypatch, caplog):
    from app.voices import store

    client = make_client()
    caplog.set_level(logging.INFO)
    real = store._write_synced
    calls = []

    def full_disk(path, data):
        calls.append(path.name)
        if path.name == "prompt.wav":  # the original upload is already written by now
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(store, "_write_synced", full_disk)
    r = client.post("/v1/voices", data={"name": "alice", "transcript": "hello there"},
                    files={"audio": ("a.wav", prompt_wav(), "audio/wav")})
    assert r.status_code == 507, r.text
    err = r.json()["error"]
    assert err["code"] == "voice_storage_full" and "disk is full" in err["message"]
    assert calls[-1] == "prompt.wav" and any(c.startswith("original.") for c in calls)
    voices_dir = tmp_path / "voices"
    assert [p.name for p in voices_dir.iterdir()] == []  # no voice dir, no .tmp- leftover
    assert client.get("/v1/voices/alice").status_code == 404
    told = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert len(told) == 1 and "cannot store voice 'alice'" in told[0].getMessage(), [r.getMessage() for r in told]
    assert not any(rec.exc_info for rec in caplog.records)  # an expected refusal: one line, no traceback
    monkeypatch.setattr(store, "_write_synced", real)
    r = client.post("/v1/voices", data={"name": "alice", "transcript": "hello there"},
                    files={"audio": ("a.wav", prompt_wav(), "audio/wav")})
    assert r.status_code == 201, r.text  # the name was not left reserved


@pytest.mark.parametrize("body", [{"text": "hi", "k" * LARGE: 1}, {"text": "hi", "format": "z" * LARGE},
                                  {"text": "hi", "mode": "m" * LARGE}])
def test_schema_errors_never_echo_a_giant_field_name_or_value(client, seen, body):
    sent = next(k if len(k) > 1000 else v for k, v in body.items() if len(k) > 1000 or len(str(v)) > 1000)
    err = refused(client.post("/v1/tts", json=body), 422, sent)
    assert err["code"] == "validation_error"
    r = client.post("/v1/tts", data={k: str(v) for k, v in body.items()})
    refused(r, 422, sent)
    assert seen == []


def test_a_crashed_registrations_leftovers_go_at_the_next_registration(make_client, tmp_path):
    """What a process killed mid-write left (``.tmp-*``, megabytes) is removed once stale, without a restart;
    a young one (maybe another replica's write in progress) stays."""
    from app.voices.library import STALE_TEMP_S

    client = make_client()
    voices_dir = tmp_path / "voices"
    old, young = voices_dir / ".tmp-0123abcd", voices_dir / ".tmp-4567ef01"
    for d in (old, young):
        (d / "features").mkdir(parents=True)
        (d / "original.wav").write_bytes(b"\0" * (5 << 20))
    stale = time.time() - STALE_TEMP_S - 60
    os.utime(old, (stale, stale))
    r = client.post("/v1/voices", data={"name": "bob", "transcript": "hello there"},
                    files={"audio": ("a.wav", prompt_wav(), "audio/wav")})
    assert r.status_code == 201, r.text
    assert sorted(p.name for p in voices_dir.iterdir()) == [".tmp-4567ef01", "bob"]
