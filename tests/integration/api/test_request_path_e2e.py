"""The request path on a real server: clients that leave, slow uploads, queue time from body-in.

The disconnect tests run the real tiny CosyVoice engine (what a user runs without
weights); the upload tests need no model and use the fake engine.
"""

from __future__ import annotations

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
LONG = " ".join([TEXT] * 4)


def jobs(srv: ServerProcess) -> dict[str, float]:
    m = metrics(srv)
    return {o: m[f'tts_engine_jobs_total{{outcome="{o}"}}'] for o in ("ok", "cancelled", "error", "timeout")}


def pool_state(srv: ServerProcess) -> dict:
    return httpx.get(srv.base_url + "/health/ready", timeout=10).json()


def hang_up_after(srv: ServerProcess, seconds: float, json: dict) -> None:
    """A client that gives up: the read timeout closes its connection."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.base_url + "/v1/tts", json=json, timeout=httpx.Timeout(10, read=seconds))


def tiny(model_dir, tmp_path, **pool) -> dict:
    return {
        "engine": {"model_dir": str(model_dir), "torch_threads": 1},
        "pool": {"workers": 1, "max_queue": 1, "queue_timeout_s": 120, "request_timeout_s": 120, **pool},
        "server": {"drain_timeout_s": 30},
        "voices": {"dir": str(tmp_path / "voices")},
    }


def test_a_client_gone_while_queued_leaves_the_queue_and_costs_no_synthesis(tiny_models, tmp_path):
    with ServerProcess(tmp_path, tiny(tiny_models(2, long=True), tmp_path)) as srv:
        first: list[httpx.Response] = []
        runner = threading.Thread(target=lambda: first.append(
            httpx.post(srv.base_url + "/v1/tts", json={"text": LONG}, timeout=300)))
        runner.start()
        wait_for(lambda: pool_state(srv)["running"] == 1, 30, "the first request runs")
        leaver = threading.Thread(target=hang_up_after, args=(srv, 0.5, {"text": "I will not wait"}))
        leaver.start()
        wait_for(lambda: pool_state(srv)["queued"] == 1, 10, "the second request is queued")
        leaver.join(10)
        gone_at = time.monotonic()
        left_at = wait_for(lambda: pool_state(srv)["queued"] == 0, 5, "the leaver leaves the queue")
        assert left_at - gone_at < 2.0
        assert pool_state(srv)["running"] == 1, "the first request was still running: the leaver left while queued"
        runner.join(300)
        assert first and first[0].status_code == 200
        wait_for(lambda: metrics(srv)["tts_inflight_requests"] == 0, 30, "everything released")
        assert jobs(srv) == {"ok": 1.0, "cancelled": 0.0, "error": 0.0, "timeout": 0.0}  # one synthesis only
        assert 'endpoint="/v1/tts",outcome="aborted"} 1.0' in httpx.get(srv.base_url + "/metrics").text


def test_a_client_gone_while_its_whole_file_runs_cancels_the_engine_job(tiny_models, tmp_path):
    with ServerProcess(tmp_path, tiny(tiny_models(2, long=True), tmp_path, max_queue=0)) as srv:
        hang_up_after(srv, 1.0, {"text": LONG})
        gone_at = time.monotonic()
        cancelled_at = wait_for(lambda: jobs(srv)["cancelled"] == 1.0, 20, "the engine job is cancelled")
        assert cancelled_at - gone_at < 5.0
        assert jobs(srv)["ok"] == 0.0
        before = metrics(srv)["process_cpu_seconds_total"]
        t0 = time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 1.5, 5, "a quiet interval")  # CPU over 1.5 s of idleness
        used = metrics(srv)["process_cpu_seconds_total"] - before
        assert used < 0.5, f"the server burned {used:.2f} s CPU in 1.5 s after the client left"
        r = httpx.post(srv.base_url + "/v1/tts", json={"text": "next"}, timeout=120)
        assert r.status_code == 200  # the only slot is free again


def fake(tmp_path, **server) -> dict:
    return {
        "dev": {"fake_engine": True},
        "pool": {"workers": 1, "max_queue": 0, "queue_timeout_s": 30, "request_timeout_s": 30},
        "server": {"drain_timeout_s": 5, "body_timeout_s": 1.0, **server},
        "voices": {"dir": str(tmp_path / "voices")},
    }


def test_a_slow_upload_gets_408_and_never_holds_a_permit(tmp_path):
    with ServerProcess(tmp_path, fake(tmp_path)) as srv:
        t0 = time.monotonic()
        sock = raw_request(srv, post_head(100) + b'{"text": ')
        wait_for(lambda: metrics(srv)["tts_body_reads"] == 1, 5, "the slow upload is being read")
        assert metrics(srv)["tts_inflight_requests"] == 0, "reading a body holds no synthesis permit"
        assert httpx.post(srv.base_url + "/v1/tts", json={"text": "x"}, timeout=10).status_code == 200
        answer = read_response(sock)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"body_timeout"' in answer
        assert time.monotonic() - t0 < 5.0
        m = metrics(srv)
        assert m["tts_body_reads"] == 0 and m['tts_body_refused_total{reason="timeout"}'] == 1.0


def test_queue_wait_counts_from_when_the_body_is_in(tmp_path):
    with ServerProcess(tmp_path, fake(tmp_path, body_timeout_s=10)) as srv:
        body = b'{"text": "a slow but honest upload"}'
        sock = raw_request(srv, post_head(len(body)) + body[:10])
        wait_for(lambda: metrics(srv)["tts_body_reads"] == 1, 5, "its body is being read")
        t0 = time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 1.0, 5, "a slow client")  # the client takes its time
        sock.sendall(body[10:])
        answer = read_response(sock)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        m = metrics(srv)
        assert m["tts_queue_wait_seconds_count"] == 1.0
        assert m["tts_queue_wait_seconds_sum"] < 0.3, m["tts_queue_wait_seconds_sum"]  # not the 1 s upload
        assert m["tts_request_duration_seconds_sum"] >= 1.0
