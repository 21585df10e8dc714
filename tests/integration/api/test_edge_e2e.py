"""Capacity follows compute, on a real server: bodies before permits, huge bodies refused unread,
streams nobody reads give their permit back and are cut, refusals paced under a retry storm."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests.support.metrics import metrics
from tests.support.raw_http import post_head, raw_request, read_response
from tests.support.server import ServerProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the quiet green hills."


def config(tmp_path, engine: dict | None = None, pool: dict | None = None, dev: dict | None = None,
           **server) -> dict:
    return {
        **({"engine": engine} if engine else {}),
        "dev": dev if dev is not None else ({} if engine else {"fake_engine": True}),
        "pool": {"workers": 1, "max_queue": 0, "queue_timeout_s": 30, "request_timeout_s": 120, **(pool or {})},
        "server": {"drain_timeout_s": 5, **server},
        "voices": {"dir": str(tmp_path / "voices")},
    }


@pytest.fixture(scope="module")
def small_uploads(tmp_path_factory):
    """One fake-engine server for the body-limit tests (each counts from its own start)."""
    tmp = tmp_path_factory.mktemp("edge")
    with ServerProcess(tmp, config(tmp, max_upload_mb=0.1)) as srv:  # 0.1 MB + 1 MB for form fields
        yield srv


@pytest.mark.parametrize("path", ["/v1/tts", "/v1/voices"])
def test_a_declared_200_mb_body_is_refused_before_it_is_sent(small_uploads, path):
    srv, too_large = small_uploads, 'tts_body_refused_total{reason="too_large"}'
    before = metrics(srv).get(too_large, 0.0)
    head = post_head(200 << 20).replace(b"POST /v1/tts", f"POST {path}".encode())
    t0 = time.monotonic()
    sock = raw_request(srv, head)  # the headers only: not one byte of the body
    answer = read_response(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower() and b"payload_too_large" in answer
    assert time.monotonic() - t0 < 2.0
    assert metrics(srv)[too_large] == before + 1.0


def test_a_chunked_body_is_cut_at_the_limit(small_uploads):
    srv = small_uploads
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sock.sendall(b"POST /v1/tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    sent, piece = 0, b"x" * 65536
    try:
        while sent < (20 << 20):
            sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            sent += len(piece)
            sock.settimeout(0.001)
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break  # the server answered
            except (TimeoutError, BlockingIOError):
                pass
            sock.settimeout(10)
    except OSError:
        pass  # the server closed while we were still sending
    sock.settimeout(10)
    answer = read_response(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < (8 << 20), f"the client pushed {sent} bytes before the server cut it"
    assert metrics(srv)["tts_body_buffered_bytes"] == 0


def sleeper(srv: ServerProcess) -> socket.socket:
    """A client that asks for a long stream and never reads a byte of it."""
    text = " ".join([TEXT] * 20)  # ~5 MB of 48 kHz PCM: more than the kernel's socket buffers (~3 MB) hold
    body = ('{"text": "%s", "stream": true, "format": "pcm", "sample_rate": 48000}' % text).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", srv.port))
    sock.sendall(post_head(len(body)) + body)
    return sock


def tiny_v2(tiny_models) -> dict:
    return {"model_dir": str(tiny_models(2)), "torch_threads": 1}


def test_a_stream_nobody_reads_gives_its_permit_back_when_synthesis_ends(tiny_models, tmp_path):
    with ServerProcess(tmp_path, config(tmp_path, tiny_v2(tiny_models), send_timeout_s=0)) as srv:
        sock = sleeper(srv)
        try:
            wait_for(lambda: metrics(srv)['tts_engine_jobs_total{outcome="ok"}'] == 1.0, 120, "synthesis ends")
            m = metrics(srv)
            assert m["tts_inflight_requests"] == 0, "the permit went back when synthesis ended"
            assert m["tts_stream_buffered_bytes"] > 0, "the unread audio waits in the stream's buffer"
            r = httpx.post(srv.base_url + "/v1/tts", json={"text": "next"}, timeout=120)
            assert r.status_code == 200  # the only place serves others while that client sleeps
        finally:
            sock.close()
        wait_for(lambda: metrics(srv)["tts_stream_buffered_bytes"] == 0, 10, "its buffer is dropped when it leaves")


def test_a_stream_whose_client_reads_nothing_is_cut_after_the_send_timeout(tiny_models, tmp_path):
    with ServerProcess(tmp_path, config(tmp_path, tiny_v2(tiny_models), send_timeout_s=2)) as srv:
        sock = sleeper(srv)
        try:
            wait_for(lambda: metrics(srv)["tts_streams_stalled_total"] == 1.0, 120, "the sleeper is cut")
            wait_for(lambda: metrics(srv)["tts_inflight_requests"] == 0, 10, "its permit is back")
            wait_for(lambda: metrics(srv)["tts_stream_buffered_bytes"] == 0, 10, "its buffer is dropped")
        finally:
            sock.close()
        assert "returned without completing" not in srv.log()
        assert "read nothing for 2 s" in srv.log()


def test_a_retry_storm_gets_paced_refusals(tmp_path):
    cfg = config(tmp_path, dev={"fake_engine": True, "fake_chunk_delay_s": 2.0}, refusals_per_s=5)
    with ServerProcess(tmp_path, cfg) as srv:
        busy = threading.Thread(target=lambda: httpx.post(srv.base_url + "/v1/tts", json={"text": "x"}, timeout=30))
        busy.start()
        wait_for(lambda: metrics(srv)["tts_inflight_requests"] == 1, 10, "the only place is taken")
        refused, t0 = 0, time.monotonic()
        with httpx.Client(base_url=srv.base_url, timeout=30) as client:  # no backoff at all
            while time.monotonic() - t0 < 2.0:
                r = client.post("/v1/tts", json={"text": "again"})
                assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
                refused += 1
        elapsed = time.monotonic() - t0
        busy.join(30)
        assert refused <= 5 + 5 * elapsed + 2, f"{refused} refusals in {elapsed:.1f} s at 5 a second"
        assert metrics(srv)["tts_refusals_held_total"] >= refused - 6
