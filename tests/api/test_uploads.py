"""Request bodies and uploads: limits, deadlines, and no library text in any response."""

from __future__ import annotations

import gc
import io
import logging
import warnings

import numpy as np
import pytest
import soundfile as sf
from fastapi.testclient import TestClient

from app.engines.fake import FakeEngine
from app.main import create_app
from app.settings import Settings
from tests.support.sounds import flac_claiming, prompt_wav


def make(tmp_path, raise_server_exceptions: bool = True, **server) -> TestClient:
    settings = Settings(dev={"fake_engine": True}, pool={"workers": 1, "max_queue": 1},
                        server={"access_log": False, **server}, voices={"dir": str(tmp_path / "voices")})
    return TestClient(create_app(settings, engine_factory=lambda i: FakeEngine()),
                      raise_server_exceptions=raise_server_exceptions)


def test_undecodable_audio_is_400_in_our_words_and_the_decoder_is_logged(tmp_path, caplog):
    with make(tmp_path) as client, caplog.at_level(logging.INFO, logger="cosyserve.api"):
        junk = b"ID3\x03\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 8  # looks like mp3, is not
        r = client.post("/v1/tts", data={"text": "hi", "prompt_text": "p"},
                        files={"prompt_audio": ("a.mp3", junk, "audio/mpeg")}, headers={"X-Request-ID": "dec-1"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "invalid_audio" and "send WAV, MP3" in err["message"]
    for leaked in ("ffmpeg", "errno", "invaliddata", "error(", "averror"):
        assert leaked not in err["message"].lower(), err["message"]
    assert any("dec-1" in rec.getMessage() and "could not be decoded" in rec.getMessage() for rec in caplog.records)


def test_a_form_part_over_the_limit_is_413_not_starlettes_400(tmp_path):
    with make(tmp_path, max_upload_mb=0.05) as client:
        r = client.post("/v1/tts", data={"text": "hi", "prompt_text": "p"},
                        files={"prompt_audio": ("a.wav", prompt_wav(3.0), "audio/wav")})
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "payload_too_large" and "Part exceeded" not in err["message"]
    assert "51 KB" in err["message"] or "KB" in err["message"]


def test_a_json_body_over_the_limit_is_413(tmp_path):
    with make(tmp_path, max_upload_mb=0.001) as client:
        r = client.post("/v1/tts", json={"text": "x" * 5000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"


def test_a_broken_multipart_body_is_400_in_our_words(tmp_path):
    with make(tmp_path) as client:
        r = client.post("/v1/tts", content=b"--nope\r\nbroken", headers={
            "content-type": "multipart/form-data; boundary=zzz"})
    assert r.status_code in (400, 422), r.text
    assert r.json()["error"]["code"] in ("invalid_form", "validation_error")


def test_an_encoder_that_fails_to_open_is_500_and_leaks_nothing(tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("libav: cannot open encoder 'libmp3lame' at 0xdeadbeef")

    with make(tmp_path, raise_server_exceptions=False) as client:
        speech = client.app.state.runtime.speech
        good, speech._make_encoder = speech._make_encoder, broken
        r = client.post("/v1/tts", json={"text": "hi", "format": "mp3", "stream": True})
        assert r.status_code == 500 and "libav" not in r.text and "0xdead" not in r.text
        stats = client.app.state.runtime.pool.stats()
        assert (stats["in_flight"], stats["running"], [s["state"] for s in stats["slots"]]) == (0, 0, ["idle"])
        speech._make_encoder = good
        assert client.post("/v1/tts", json={"text": "hi", "format": "mp3"}).status_code == 200


@pytest.mark.parametrize("path, data, field", [
    ("/v1/tts", {"text": "hi", "prompt_text": "p"}, "prompt_audio"),
    ("/v1/tts", {"text": ""}, "prompt_audio"),  # refused (422) after the form was parsed
    ("/inference_zero_shot", {"tts_text": "hi", "prompt_text": "p"}, "prompt_wav"),
    ("/v1/voices", {"name": "closed", "transcript": "p"}, "audio"),
    ("/v1/voices", {"name": "closed", "transcript": "p"}, "unused"),  # a file no handler reads
])
def test_uploaded_files_are_closed_when_the_request_ends(tmp_path, path, data, field):
    """Starlette spools each uploaded file to a temporary file; our handlers parse the form themselves,
    so they must close it (a leak shows as "ResourceWarning: Unclosed file" once it is collected)."""
    with make(tmp_path) as client, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        r = client.post(path, data=data, files={field: ("p.wav", prompt_wav(3.0), "audio/wav")})
        gc.collect()
    assert r.status_code < 500, r.text
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []


def sf_flac(seconds: float, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * rate), np.int16), rate, format="FLAC")
    return buf.getvalue()


def test_prompt_audio_longer_than_a_prompt_is_refused_from_its_header(tmp_path):
    """A small FLAC whose header says 10 h: 400 naming its length, decided before a frame is decoded."""
    data = sf_flac(2.0, 48000)
    with make(tmp_path) as client:
        r = client.post("/v1/tts", data={"text": "hi", "prompt_text": "p"},
                        files={"prompt_audio": ("a.flac", flac_claiming(data, 10 * 3600 * 48000), "audio/flac")})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_audio", err
        assert err["message"] == "prompt_audio is 36000.00 s long; send 1 to 30 seconds of speech"
        long_stream = sf_flac(31.0, 16000)
        r = client.post("/v1/tts", data={"text": "hi", "prompt_text": "p"},
                        files={"prompt_audio": ("a.flac", flac_claiming(long_stream, 0), "audio/flac")})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] == "prompt_audio is longer than 30 s; send 1 to 30 seconds of speech"
