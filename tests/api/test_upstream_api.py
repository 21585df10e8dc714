"""Upstream-compatible surface (CosyVoice's runtime/python/fastapi server) over the real pool."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.support.fake_app import StubLibrary, hold, wait_queued
from tests.support.sounds import prompt_wav

RATE = 22050  # CosyVoice-300M's native rate: the compat surface must not resample


def files(seconds: float = 2.0) -> dict:
    # what upstream's client sends: ('prompt_wav', ('prompt_wav', <file>, 'application/octet-stream'))
    return {"prompt_wav": ("prompt_wav", prompt_wav(seconds), "application/octet-stream")}


def pcm_samples(behaviour) -> int:
    return behaviour.chunks * int(behaviour.chunk_s * behaviour.sample_rate)


def check_pcm(r, behaviour) -> np.ndarray:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-sample-rate"] == str(RATE)
    pcm = np.frombuffer(r.content, dtype=np.int16)  # what upstream's client does
    assert len(pcm) == pcm_samples(behaviour)
    assert np.abs(pcm).max() > 1000  # real audio, not silence
    return pcm


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_sft_form_body_on_get_and_post(make_client, behaviour, seen, method):
    client = make_client(sample_rate=RATE)
    r = client.request(method, "/inference_sft", data={"tts_text": "你好", "spk_id": "fake_male"})
    check_pcm(r, behaviour)
    assert (seen[-1].mode, seen[-1].speaker, seen[-1].text) == ("sft", "fake_male", "你好")
    assert seen[-1].stream is False  # upstream runs the model sentence by sentence


def test_sft_multipart_and_query_string(make_client, behaviour, seen):
    client = make_client(sample_rate=RATE)
    r = client.request("GET", "/inference_sft", data={"tts_text": "hi", "spk_id": "fake_female"},
                       files={"unused": ("x", b"1", "application/octet-stream")})
    check_pcm(r, behaviour)
    check_pcm(client.get("/inference_sft", params={"tts_text": "hi", "spk_id": "fake_female"}), behaviour)
    assert [s.speaker for s in seen] == ["fake_female", "fake_female"]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_zero_shot_with_uploaded_wav(make_client, behaviour, seen, method):
    client = make_client(sample_rate=RATE)
    r = client.request(method, "/inference_zero_shot", data={"tts_text": "hello", "prompt_text": "a prompt"},
                       files=files(2.0))
    check_pcm(r, behaviour)
    req = seen[-1]
    assert (req.mode, req.prompt_text) == ("zero_shot", "a prompt")
    assert req.prompt_audio.sample_rate == 16000
    assert abs(req.prompt_audio.duration_s - 2.0) < 0.01


def test_cross_lingual_instruct_and_instruct2(make_client, behaviour, seen):
    client = make_client(sample_rate=RATE)
    check_pcm(client.request("GET", "/inference_cross_lingual", data={"tts_text": "hi"}, files=files()), behaviour)
    assert seen[-1].mode == "cross_lingual" and seen[-1].prompt_audio is not None
    check_pcm(client.post("/inference_instruct", data={"tts_text": "hi", "spk_id": "fake_female",
                                                       "instruct_text": "calm"}), behaviour)
    assert (seen[-1].mode, seen[-1].speaker, seen[-1].instruct_text) == ("instruct", "fake_female", "calm")
    check_pcm(client.request("GET", "/inference_instruct2", data={"tts_text": "hi", "instruct_text": "fast"},
                             files=files()), behaviour)
    assert (seen[-1].mode, seen[-1].instruct_text) == ("instruct2", "fast") and seen[-1].prompt_audio is not None


def test_spk_id_may_name_a_library_voice(make_client, behaviour, seen):
    client = make_client(sample_rate=RATE)
    client.app.state.runtime.speech.library = StubLibrary("narrator")
    check_pcm(client.post("/inference_sft", data={"tts_text": "hi", "spk_id": "narrator"}), behaviour)
    assert seen[-1].mode == "zero_shot" and seen[-1].voice == {"voice": "narrator"}


def test_streams_every_chunk(make_client, behaviour):
    client = make_client(sample_rate=RATE, chunks=5)
    with client.stream("GET", "/inference_sft", data={"tts_text": "hi", "spk_id": "fake_male"}) as r:
        assert r.status_code == 200 and "content-length" not in r.headers
        body = b"".join(r.iter_bytes())
    assert len(body) == 2 * pcm_samples(behaviour)


@pytest.mark.parametrize("path,data,with_file,status,code", [
    ("/inference_sft", {"tts_text": "hi"}, False, 422, "validation_error"),
    ("/inference_sft", {"spk_id": "fake_male"}, False, 422, "validation_error"),
    ("/inference_sft", {"tts_text": "hi", "spk_id": "nobody"}, False, 400, "unknown_voice"),
    ("/inference_sft", {"tts_text": "a" * 5000, "spk_id": "fake_male"}, False, 400, "text_too_long"),
    ("/inference_zero_shot", {"tts_text": "hi", "prompt_text": "p"}, False, 422, "validation_error"),
    ("/inference_instruct2", {"tts_text": "hi"}, True, 422, "validation_error"),
])
def test_errors_use_the_native_envelope(make_client, path, data, with_file, status, code):
    client = make_client(sample_rate=RATE)
    r = client.post(path, data=data, files=files() if with_file else None, headers={"X-Request-ID": "rid-7"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["code"], err["request_id"]) == (code, "rid-7") and err["message"]


def test_bad_prompt_audio_is_400(make_client):
    client = make_client(sample_rate=RATE)
    r = client.post("/inference_zero_shot", data={"tts_text": "hi", "prompt_text": "p"}, files=files(0.3))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_audio"
    r = client.post("/inference_zero_shot", data={"tts_text": "hi", "prompt_text": "p"},
                    files={"prompt_wav": ("prompt_wav", b"not audio at all" * 10, "application/octet-stream")})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_audio"


def test_unsupported_mode_is_400(make_client):
    client = make_client(sample_rate=RATE, modes=("sft", "zero_shot"))
    r = client.post("/inference_instruct", data={"tts_text": "hi", "spk_id": "fake_male", "instruct_text": "x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_input"


def test_overload_is_503(make_client, behaviour):
    client = make_client(pool={"workers": 1, "max_queue": 1}, sample_rate=RATE)
    gate = hold(behaviour)
    results: list[int] = []

    def call() -> None:
        results.append(client.post("/inference_sft", data={"tts_text": "held", "spk_id": "fake_male"}).status_code)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    wait_queued(client, running=1, queued=1)  # one runs, the other holds the only queue place
    r = client.request("GET", "/inference_zero_shot", data={"tts_text": "x", "prompt_text": "p"}, files=files())
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "overloaded" and "retry-after" in r.headers
    gate.set()
    for t in threads:
        t.join(10)
    assert results == [200, 200]


def test_draining_is_503(make_client):
    client = make_client(sample_rate=RATE)
    client.portal.call(client.app.state.runtime.pool.begin_drain)
    r = client.post("/inference_sft", data={"tts_text": "late", "spk_id": "fake_male"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
