"""G.711 (mulaw, alaw, wav_mulaw, wav_alaw) on every surface that chooses a format, over FakeEngines.

Each answer is read back with FFmpeg (and libsndfile for the WAV forms) and compared with the
same request's pcm answer resampled to 8 kHz: same length, same waveform.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from app.audio.resample import resample_int16
from tests.support.decoding import CONTENT_TYPES, G711_FORMATS, decode_g711
from tests.support.sse import parse_sse, sse_audio
from tests.support.ws import PATH, error, send, utterance

ERROR_KEYS = {"message", "type", "param", "code"}
UNKNOWN = ("ulaw", "pcmu", "g711", "mu-law", "wav-mulaw")


def like_pcm(y: np.ndarray, pcm: bytes, rate: int) -> None:
    """``y`` (8 kHz) is ``pcm`` (int16 at ``rate``) resampled: the same length, correlation near 1."""
    ref = resample_int16(np.frombuffer(pcm, "<i2"), rate, 8000).astype(float)
    assert abs(len(y) - len(ref)) <= 1, (len(y), len(ref))
    n = min(len(y), len(ref))
    assert np.abs(ref).max() > 5000  # the tone, not silence
    assert np.corrcoef(y[:n].astype(float), ref[:n])[0, 1] > 0.999


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("rate", [24000, 22050])
@pytest.mark.parametrize("fmt", G711_FORMATS)
def test_native_tts_sends_8k_g711(make_client, fmt, rate, stream):
    client = make_client(sample_rate=rate)
    pcm = client.post("/v1/tts", json={"text": "hello", "format": "pcm"})
    r = client.post("/v1/tts", json={"text": "hello", "format": fmt, "stream": stream})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == CONTENT_TYPES[fmt]
    assert r.headers["x-sample-rate"] == "8000"
    like_pcm(decode_g711(r.content, fmt), pcm.content, rate)


def test_native_sample_rate_does_not_move_g711_off_8k(make_client):
    r = make_client().post("/v1/tts", json={"text": "hello", "format": "mulaw", "sample_rate": 16000})
    assert r.status_code == 200 and r.headers["x-sample-rate"] == "8000"
    assert len(decode_g711(r.content, "mulaw")) == len(r.content)


@pytest.mark.parametrize("fmt", G711_FORMATS)
def test_openai_speech_sends_8k_g711(make_client, fmt):
    client = make_client(sample_rate=22050)
    body: dict[str, Any] = {"model": "tts-1", "voice": "alloy", "input": "hello world"}
    pcm = client.post("/v1/audio/speech", json={**body, "response_format": "pcm"})  # 24 kHz, as OpenAI's
    r = client.post("/v1/audio/speech", json={**body, "response_format": fmt})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == CONTENT_TYPES[fmt] and r.headers["x-sample-rate"] == "8000"
    like_pcm(decode_g711(r.content, fmt), pcm.content, 24000)
    sse = client.post("/v1/audio/speech", json={**body, "response_format": fmt, "stream_format": "sse"})
    assert sse_audio(parse_sse(sse.text)) == r.content


def ws_utterance(client, text: str, **config: Any) -> tuple[dict, bytes, dict]:
    """One utterance in a fresh session configured before it (a config right after audio.done may still
    find the session busy while the finished job closes)."""
    with client.websocket_connect(PATH) as ws:
        if config:
            send(ws, "session.config", **config)
        send(ws, "input.text", text=text)
        send(ws, "input.done")
        return utterance(ws)


def test_websocket_session_speaks_g711(open_client, behaviour):
    client = open_client()
    _, pcm, _ = ws_utterance(client, "One sentence.")
    start, mulaw, done = ws_utterance(client, "One sentence.", response_format="mulaw")
    assert start == {"type": "audio.start", "utterance": 1, "format": "mulaw", "media_type": "audio/basic",
                     "sample_rate": 8000, "channels": 1, "sample_width": 1}
    assert len(mulaw) == round(done["audio_seconds"] * 8000)
    like_pcm(decode_g711(mulaw, "mulaw"), pcm, 24000)
    wav_start, wav, _ = ws_utterance(client, "One sentence.", response_format="wav_alaw")
    assert (wav_start["format"], wav_start["sample_rate"], wav_start["sample_width"]) == ("wav_alaw", 8000, 1)
    assert wav[:4] == b"RIFF" and struct.unpack("<H", wav[20:22])[0] == 6  # WAVE_FORMAT_ALAW
    like_pcm(decode_g711(wav, "wav_alaw"), pcm, 24000)


@pytest.mark.parametrize("name", UNKNOWN)
def test_unknown_format_names_are_refused_on_every_surface(make_client, open_client, name):
    r = make_client().post("/v1/tts", json={"text": "hi", "format": name}, headers={"X-Request-ID": "rid-g"})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "validation_error" and err["request_id"] == "rid-g" and err["message"]
    r = make_client().post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": "hi",
                                                      "response_format": name})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS and err["param"] == "response_format" and err["code"] == "unsupported_format"
    assert "mulaw" in err["message"] and "wav_alaw" in err["message"]  # says what to send instead
    with open_client().websocket_connect(PATH) as ws:
        send(ws, "session.config", response_format=name)
        assert error(ws)["param"] == "response_format"
