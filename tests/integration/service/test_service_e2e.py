"""End to end: a real `cosyserve serve` subprocess on the tiny real CosyVoice2 model."""

from __future__ import annotations

import io
import signal
import struct
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.support.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the quiet green hills."
SHORT = "Hello there, this is a streaming test."  # on the long tiny model: several chunks, seconds of audio


def config(model_dir, tmp_path, **pool) -> dict:
    p = {"workers": 1, "max_queue": 1, "queue_timeout_s": 60, "request_timeout_s": 120}
    p.update(pool)
    return {
        "engine": {"model_dir": str(model_dir), "torch_threads": 1},
        "pool": p,
        "server": {"drain_timeout_s": 120, "drain_delay_s": 0},
        "voices": {"dir": str(tmp_path / "voices")},
    }


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    with ServerProcess(tmp, config(tiny_models(2), tmp, workers=2, max_queue=2)) as srv:
        yield srv


def test_curl_style_request_returns_playable_wav(server):
    r = httpx.post(server.base_url + "/v1/tts", json={"text": "hello"}, timeout=60)
    assert r.status_code == 200, r.text
    audio, rate = sf.read(io.BytesIO(r.content), dtype="int16")
    assert rate == 24000 and len(audio) > 0.1 * rate
    assert r.headers["x-request-id"]


@pytest.fixture(scope="module")
def one_slot(tiny_models, tmp_path_factory):
    """The long tiny model (streams arrive in several chunks), one worker, no queue."""
    tmp = tmp_path_factory.mktemp("e2e-one-slot")
    with ServerProcess(tmp, config(tiny_models(2, long=True), tmp, workers=1, max_queue=0)) as srv:
        yield srv


def test_streaming_wav_arrives_in_chunks(one_slot):
    srv = one_slot
    arrivals = []
    body = b""
    with httpx.stream("POST", srv.base_url + "/v1/tts", json={"text": SHORT, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for part in r.iter_raw():
            arrivals.append(time.perf_counter())
            body += part
    assert struct.unpack("<I", body[40:44])[0] == 0xFFFFFFFF
    pcm = np.frombuffer(body[44:], dtype="<i2")
    assert len(pcm) > 24000
    assert len(arrivals) >= 3
    assert arrivals[-1] - arrivals[0] > 0.05  # really streamed, not sent at the end


def test_burst_beyond_capacity_gets_503_and_admitted_requests_succeed(server):
    n = 12  # capacity is workers 2 + queue 2 = 4
    results: list[tuple[int, float, bytes]] = []
    lock = threading.Lock()
    start = threading.Barrier(n)

    def call():
        start.wait()
        t0 = time.perf_counter()
        r = httpx.post(server.base_url + "/v1/tts", json={"text": TEXT}, timeout=120)
        with lock:
            results.append((r.status_code, time.perf_counter() - t0, r.content if r.status_code == 200 else r.headers.get("retry-after", "")))

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    codes = sorted(c for c, _, _ in results)
    assert len(codes) == n
    assert set(codes) <= {200, 503}, codes
    ok = [r for r in results if r[0] == 200]
    rejected = [r for r in results if r[0] == 503]
    assert 1 <= len(ok) <= 4 + 1 and len(rejected) >= n - 5
    assert all(int(ra) >= 1 for _, _, ra in rejected)
    assert max(dt for _, dt, _ in rejected) < 2.0  # answered at once, not queued
    for _, _, content in ok:
        audio, rate = sf.read(io.BytesIO(content), dtype="int16")
        assert rate == 24000 and len(audio) > 0
    ready = httpx.get(server.base_url + "/health/ready", timeout=10).json()
    assert ready["running"] == 0 and ready["queued"] == 0


def test_client_disconnect_mid_stream_frees_the_slot(one_slot):
    srv = one_slot
    long_text = " ".join([TEXT] * 4)
    with httpx.stream("POST", srv.base_url + "/v1/tts", json={"text": long_text, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        next(r.iter_raw())  # first audio arrived; now hang up
    t0 = time.perf_counter()
    deadline = t0 + 10
    status = None
    while time.perf_counter() < deadline:  # the only slot must come back promptly
        r2 = httpx.post(srv.base_url + "/v1/tts", json={"text": "next request"}, timeout=60)
        status = r2.status_code
        if status == 200:
            break
        time.sleep(0.1)
    assert status == 200
    assert time.perf_counter() - t0 < 10
    assert "aborted" in srv.log() or "cancelled" in srv.log()


def test_sigterm_drains_streams_refuses_new_work_and_exits_zero(tiny_models, tmp_path):
    cfg = config(tiny_models(2, long=True), tmp_path, workers=1, max_queue=1)
    cfg["server"]["drain_delay_s"] = 5.0
    srv = ServerProcess(tmp_path, cfg).start()
    try:
        body = bytearray()
        got_first = threading.Event()
        done = threading.Event()
        errors: list[BaseException] = []

        def stream():
            try:
                with httpx.stream("POST", srv.base_url + "/v1/tts", json={"text": SHORT, "stream": True}, timeout=180) as r:
                    assert r.status_code == 200
                    for part in r.iter_raw():
                        body.extend(part)
                        got_first.set()
            except BaseException as exc:  # surfaced by the assertions below
                errors.append(exc)
            finally:
                done.set()

        t = threading.Thread(target=stream)
        t.start()
        assert got_first.wait(120)
        srv.signal(signal.SIGTERM)
        time.sleep(0.3)
        # during drain_delay_s the server still listens: probes say not ready, new work is refused
        ready = httpx.get(srv.base_url + "/health/ready", timeout=10)
        assert ready.status_code == 503 and "draining" in ready.json()["reasons"]
        refused = httpx.post(srv.base_url + "/v1/tts", json={"text": "too late"}, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        assert httpx.get(srv.base_url + "/health/live", timeout=10).status_code == 200
        assert done.wait(180)
        t.join()
        assert not errors, (errors, srv.log()[-4000:])
        assert srv.wait(60) == 0
        # the stream completed as a valid WAV (unknown-length header, whole samples)
        assert bytes(body[:4]) == b"RIFF" and len(body) > 44 + 24000
        assert (len(body) - 44) % 2 == 0
        audio, rate = sf.read(io.BytesIO(bytes(body)), dtype="int16")
        assert rate == 24000 and len(audio) == (len(body) - 44) // 2
    finally:
        srv.stop(signal.SIGKILL)
