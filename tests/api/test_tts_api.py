"""Native API over the real pool with FakeEngines: formats, errors, overload, deadlines, probes."""

from __future__ import annotations

import io
import struct
import threading
import time

import numpy as np
import pytest
import soundfile as sf

from app.engines.base import EngineFailure
from tests.support.fake_app import hold, wait_queued


def _wav(data: bytes) -> tuple[np.ndarray, int]:
    audio, rate = sf.read(io.BytesIO(data), dtype="int16")
    return audio, rate


def test_tts_returns_a_valid_wav(client, behaviour):
    r = client.post("/v1/tts", json={"text": "hello world"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "audio/wav"
    assert r.headers["x-sample-rate"] == "24000"
    audio, rate = _wav(r.content)
    assert rate == 24000
    assert len(audio) == behaviour.chunks * int(behaviour.chunk_s * 24000)
    riff, size, wave = struct.unpack("<4sI4s", r.content[:12])
    assert (riff, wave) == (b"RIFF", b"WAVE") and size == len(r.content) - 8


def test_stream_wav_has_unknown_length_header_and_all_audio(client, behaviour):
    behaviour.chunks = 5
    with client.stream("POST", "/v1/tts", json={"text": "hello", "stream": True}) as r:
        assert r.status_code == 200
        body = b"".join(r.iter_bytes())
    assert struct.unpack("<I", body[4:8])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", body[40:44])[0] == 0xFFFFFFFF
    pcm = np.frombuffer(body[44:], dtype="<i2")
    assert len(pcm) == 5 * int(behaviour.chunk_s * 24000)


def test_stream_pcm_reports_rate_and_is_raw(client, behaviour):
    r = client.post("/v1/tts", json={"text": "hi", "stream": True, "format": "pcm"})
    assert r.status_code == 200
    assert r.headers["x-sample-rate"] == "24000"
    assert len(r.content) == 2 * behaviour.chunks * int(behaviour.chunk_s * 24000)


def test_speakers_lists_presets(client):
    r = client.get("/v1/speakers")
    assert r.status_code == 200
    body = r.json()
    assert body["speakers"] == ["fake_female", "fake_male"]
    assert body["sample_rate"] == 24000
    assert "sft" in body["modes"]


def test_request_id_is_echoed_or_generated(client):
    r = client.post("/v1/tts", json={"text": "hi"}, headers={"X-Request-ID": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r2 = client.post("/v1/tts", json={"text": "hi"})
    assert len(r2.headers["x-request-id"]) == 32


def test_bad_input_gets_4xx_envelope(client):
    cases = [
        ({"text": ""}, 400, "invalid_input"),
        ({"text": "hi", "speaker": "nobody"}, 400, "unknown_voice"),
        ({"text": "hi", "speed": 9}, 422, "validation_error"),
        ({"text": "hi", "format": "ogg"}, 422, "validation_error"),
        ({"text": "hi", "bogus": 1}, 422, "validation_error"),
        ({"text": "hi", "mode": "zero_shot"}, 400, "invalid_input"),
    ]
    for body, status, code in cases:
        r = client.post("/v1/tts", json=body, headers={"X-Request-ID": "rid-1"})
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == code, (body, err)
        assert err["request_id"] == "rid-1"
        assert err["message"]
    r = client.post("/v1/tts", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error"


def test_too_long_text_is_rejected(client):
    r = client.post("/v1/tts", json={"text": "a" * 5000})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "text_too_long"


def test_engine_failure_before_first_byte_is_500_without_details(client, behaviour):
    behaviour.fail_at_chunk = 0
    r = client.post("/v1/tts", json={"text": "hi", "stream": True})
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["code"] == "engine_failure"
    assert "told to fail" not in err["message"]


def test_engine_failure_after_first_byte_aborts_the_stream(client, behaviour):
    behaviour.fail_at_chunk = 2
    behaviour.chunks = 4
    got = b""
    # the headers are gone: Starlette can only abort the body (TestClient re-raises that)
    with pytest.raises(RuntimeError, match="response already started") as aborted, client.stream(
        "POST", "/v1/tts", json={"text": "hi", "stream": True, "format": "pcm"}
    ) as r:
        assert r.status_code == 200
        for part in r.iter_bytes():
            got += part
    assert isinstance(aborted.value.__context__, EngineFailure)
    assert 0 < len(got) < 2 * 4 * int(behaviour.chunk_s * 24000)
    # the slot was released: a healthy request still works
    behaviour.fail_at_chunk = None
    assert client.post("/v1/tts", json={"text": "ok"}).status_code == 200


def test_overload_is_503_with_retry_after_at_once(client_factory, behaviour):
    client = client_factory(workers=1, max_queue=1)
    gate = hold(behaviour)
    results: list[int] = []

    def call():
        results.append(client.post("/v1/tts", json={"text": "held"}).status_code)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    wait_queued(client, running=1, queued=1)  # one runs, the other holds the only queue place
    t0 = time.perf_counter()
    r = client.post("/v1/tts", json={"text": "rejected"})
    elapsed = time.perf_counter() - t0
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "overloaded"
    assert int(r.headers["retry-after"]) >= 1
    assert elapsed < 1.0
    gate.set()
    for t in threads:
        t.join(10)
    assert results == [200, 200]


def test_deadline_is_504_and_frees_the_slot(client_factory, behaviour):
    client = client_factory(workers=1, max_queue=0, request_timeout_s=0.3)
    behaviour.first_chunk_delay_s = 5.0
    t0 = time.perf_counter()
    r = client.post("/v1/tts", json={"text": "slow"})
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "deadline_exceeded"
    assert time.perf_counter() - t0 < 3.0
    behaviour.first_chunk_delay_s = 0.0
    assert client.post("/v1/tts", json={"text": "fast"}).status_code == 200


def test_probes(client):
    assert client.get("/health/live").json() == {"status": "alive"}
    r = client.get("/health/ready")
    assert r.status_code == 200
    assert r.json()["status"] == "ready"
    assert r.json()["slots"] == ["idle", "idle"]


def test_readiness_fails_when_engine_unhealthy(client, behaviour):
    behaviour.unhealthy = True
    r = client.get("/health/ready")
    assert r.status_code == 503
    assert "engine health check failed" in r.json()["reasons"]


def test_draining_refuses_new_work_and_readiness(client):
    runtime = client.app.state.runtime
    client.portal.call(runtime.pool.begin_drain)
    runtime.draining = True
    r = client.get("/health/ready")
    assert r.status_code == 503 and "draining" in r.json()["reasons"]
    r = client.post("/v1/tts", json={"text": "late"})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "draining"
    assert "retry-after" in r.headers
    assert client.get("/health/live").status_code == 200


def test_unknown_route_uses_envelope(client):
    r = client.get("/nope")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_overload_is_refused_at_the_edge_before_the_body_is_read(client_factory, behaviour):
    client = client_factory(workers=1, max_queue=0)
    gate = hold(behaviour)
    held = threading.Thread(target=lambda: client.post("/v1/tts", json={"text": "held"}))
    held.start()
    deadline = time.monotonic() + 5
    while not behaviour.started and time.monotonic() < deadline:
        time.sleep(0.01)
    # a malformed body would be a 422 if it were parsed: under overload it is never looked at
    r = client.post("/v1/tts", content=b"{not json", headers={"content-type": "application/json", "X-Request-ID": "edge-1"})
    assert r.status_code == 503
    assert r.json()["error"] == {"code": "overloaded", "message": r.json()["error"]["message"], "request_id": "edge-1"}
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "x", "voice": "alloy"})
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_overloaded"
    assert client.app.state.runtime.pool.stats()["in_flight"] == 1
    gate.set()
    held.join(10)
    assert client.app.state.runtime.pool.stats()["in_flight"] == 0
    # a bad request that was admitted gives its permit back
    assert client.post("/v1/tts", json={"text": ""}).status_code == 400
    assert client.app.state.runtime.pool.stats()["in_flight"] == 0


def test_seed_reaches_the_engine_and_is_validated(make_client, seen):
    client = make_client()
    assert client.post("/v1/tts", json={"text": "hello", "seed": 1234}).status_code == 200
    assert client.post("/v1/tts", json={"text": "hello"}).status_code == 200
    assert [r.seed for r in seen[-2:]] == [1234, None]
    r = client.post("/v1/tts", json={"text": "hello", "seed": -1})
    assert r.status_code == 422 and r.json()["error"]["code"]


def test_normalize_reaches_the_engine_and_is_validated(make_client, seen):
    client = make_client()
    assert client.post("/v1/tts", json={"text": "I have 5 apples", "normalize": False}).status_code == 200
    assert client.post("/v1/tts", json={"text": "I have 5 apples"}).status_code == 200
    assert client.post("/v1/tts", data={"text": "I have 5 apples", "normalize": "false"}).status_code == 200
    assert client.post("/v1/audio/speech", json={"model": "tts-1", "input": "5 apples", "voice": "alloy"}).status_code == 200
    assert [r.normalize for r in seen[-4:]] == [False, None, False, None]  # OpenAI: the engine's default
    n = len(seen)
    r = client.post("/v1/tts", json={"text": "hello", "normalize": "sometimes"})
    assert r.status_code == 422 and r.json()["error"]["code"] and len(seen) == n


def test_first_chunk_tokens_reach_the_engine_and_size_the_first_chunk(client, behaviour):
    r = client.post("/v1/tts", json={"text": "hello", "stream": True, "format": "pcm", "first_chunk_tokens": 5})
    assert r.status_code == 200
    assert behaviour.first_chunks[-1] == 5
    rate = int(r.headers["x-sample-rate"])
    per_chunk = int(behaviour.chunk_s * rate)
    assert len(r.content) // 2 == 5 * rate // 25 + (behaviour.chunks - 1) * per_chunk  # 0.2 s first, then as usual
    assert client.post("/v1/tts", json={"text": "hello", "stream": True}).status_code == 200
    assert behaviour.first_chunks[-1] is None  # default: the model's own first chunk


@pytest.mark.parametrize("body, why", [
    ({"stream": True, "first_chunk_tokens": 4}, "between 5 and 100"),  # below the model's range
    ({"stream": True, "first_chunk_tokens": 101}, "between 5 and 100"),  # above it
    ({"first_chunk_tokens": 10}, "stream: true"),  # not a stream: there is no first chunk to size
])
def test_first_chunk_tokens_outside_the_models_range_is_a_400_envelope(client, behaviour, body, why):
    n = len(behaviour.started)
    r = client.post("/v1/tts", json={"text": "hello", **body}, headers={"X-Request-ID": "fc-1"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_first_chunk_tokens" and "first_chunk_tokens" in err["message"]
    assert why in err["message"] and err["request_id"] == "fc-1"
    assert len(behaviour.started) == n  # refused before any engine work


def test_first_chunk_tokens_on_a_model_that_cannot_is_a_400(make_client, behaviour):
    client = make_client(first_chunk_tokens=None)
    r = client.post("/v1/tts", json={"text": "hello", "stream": True, "first_chunk_tokens": 10})
    assert r.status_code == 400 and "cannot change its first chunk" in r.json()["error"]["message"]


def test_first_chunk_tokens_out_of_the_schemas_bounds_is_a_422(client):
    for value in (0, 1001, "soon"):
        r = client.post("/v1/tts", json={"text": "hello", "stream": True, "first_chunk_tokens": value})
        assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error", value
