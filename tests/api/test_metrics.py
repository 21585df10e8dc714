"""/metrics over the real app and pool with FakeEngines: every outcome moves the right series."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api.context import RequestContext
from app.engines.fake import FakeEngine
from app.main import create_app
from app.metrics import Metrics, outcome_of
from app.settings import Settings
from tests.support.fake_app import hold, make_settings
from tests.support.metrics import scrape, value


def requests_total(samples: dict, endpoint: str, outcome: str) -> float:
    return value(samples, "tts_requests_total", endpoint=endpoint, outcome=outcome)


def test_metrics_parse_and_list_every_family(client):
    samples = scrape(client)
    names = {name for name, _ in samples}
    for name in ("tts_requests_total", "tts_rejected_total", "tts_inflight_requests", "tts_queue_depth",
                 "tts_queue_wait_seconds_bucket", "tts_time_to_first_audio_seconds_bucket",
                 "tts_request_duration_seconds_bucket", "tts_real_time_factor_bucket", "tts_audio_seconds_total",
                 "tts_engine_errors_total", "tts_slots", "process_resident_memory_bytes",
                 "tts_process_peak_rss_bytes", "process_heap_bytes", "process_heap_trims_total", "process_threads",
                 "tts_cache_lookups_total"):
        assert name in names, name
    assert value(samples, "tts_slots", state="idle") == 2
    assert value(samples, "tts_slots", state="busy") == 0
    assert value(samples, "process_resident_memory_bytes") > 0
    assert value(samples, "tts_process_peak_rss_bytes") >= value(samples, "process_resident_memory_bytes") * 0.5
    assert not any(":" in name for name in names)
    assert value(samples, "process_heap_bytes", state="in_use") > 0


def test_ok_requests_count_per_route_template_and_observe_ttfa(client, behaviour):
    behaviour.first_chunk_delay_s = 0.05
    assert client.post("/v1/tts", json={"text": "hello"}).status_code == 200
    assert client.post("/v1/tts", json={"text": "hello", "stream": True, "format": "pcm"}).status_code == 200
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": "hi", "response_format": "wav"})
    assert r.status_code == 200
    assert client.get("/inference_sft", params={"tts_text": "hi", "spk_id": "fake_male"}).status_code == 200
    client.get("/health/ready")
    client.get("/v1/speakers")
    s = scrape(client)
    assert requests_total(s, "/v1/tts", "ok") == 2
    assert requests_total(s, "/v1/audio/speech", "ok") == 1
    assert requests_total(s, "/inference_sft", "ok") == 1
    endpoints = {dict(labels).get("endpoint") for name, labels in s if name == "tts_requests_total"}
    assert "/health/ready" not in endpoints and "/metrics" not in endpoints and "/v1/speakers" not in endpoints
    assert value(s, "tts_time_to_first_audio_seconds_count") == 4
    assert value(s, "tts_time_to_first_audio_seconds_sum") >= 4 * 0.05
    assert value(s, "tts_time_to_first_audio_seconds_bucket", le="0.01") == 0
    assert value(s, "tts_request_duration_seconds_count") == 4
    assert value(s, "tts_queue_wait_seconds_count") == 4
    per_request = behaviour.chunks * behaviour.chunk_s
    assert value(s, "tts_audio_seconds_total") == pytest.approx(4 * per_request, rel=1e-3)
    assert value(s, "tts_real_time_factor_count") == 4
    assert value(s, "tts_engine_jobs_total", outcome="ok") == 4
    assert value(s, "tts_engine_errors_total") == 0
    assert value(s, "tts_inflight_requests") == 0


def test_client_errors_count_as_client_error_not_engine_error(client):
    assert client.post("/v1/tts", json={"text": ""}).status_code == 400
    assert client.post("/v1/tts", json={"text": "hi", "speed": 9}).status_code == 422
    assert client.post("/v1/tts", json={"text": "hi", "speaker": "nobody"}).status_code == 400
    s = scrape(client)
    assert requests_total(s, "/v1/tts", "client_error") == 3
    assert requests_total(s, "/v1/tts", "ok") == 0
    assert value(s, "tts_engine_errors_total") == 0
    assert value(s, "tts_rejected_total", reason="queue_full") == 0


def test_overload_counts_a_rejection(client_factory, behaviour):
    client = client_factory(workers=1, max_queue=0)
    gate = hold(behaviour)
    results: list[int] = []
    held = threading.Thread(target=lambda: results.append(client.post("/v1/tts", json={"text": "held"}).status_code))
    held.start()
    deadline = time.monotonic() + 5
    while not behaviour.started and time.monotonic() < deadline:
        time.sleep(0.01)
    busy = scrape(client)
    assert value(busy, "tts_slots", state="busy") == 1
    assert value(busy, "tts_inflight_requests") == 1
    assert client.post("/v1/tts", json={"text": "refused"}).status_code == 503
    gate.set()
    held.join(10)
    assert results == [200]
    s = scrape(client)
    assert value(s, "tts_rejected_total", reason="queue_full") == 1
    assert requests_total(s, "/v1/tts", "rejected") == 1
    assert requests_total(s, "/v1/tts", "ok") == 1
    assert value(s, "tts_slots", state="idle") == 1


def test_queue_depth_gauge_follows_waiting_requests(client_factory, behaviour):
    client = client_factory(workers=1, max_queue=2)
    gate = hold(behaviour)
    threads = [threading.Thread(target=client.post, args=("/v1/tts",), kwargs={"json": {"text": "x"}}) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and value(scrape(client), "tts_queue_depth") < 2:
        time.sleep(0.02)
    assert value(scrape(client), "tts_queue_depth") == 2
    gate.set()
    for t in threads:
        t.join(10)
    s = scrape(client)
    assert value(s, "tts_queue_depth") == 0
    assert value(s, "tts_queue_wait_seconds_count") == 3


def test_deadline_counts_a_timeout(client_factory, behaviour):
    client = client_factory(workers=1, max_queue=0, request_timeout_s=0.3)
    behaviour.first_chunk_delay_s = 5.0
    assert client.post("/v1/tts", json={"text": "slow"}).status_code == 504
    s = scrape(client)
    assert requests_total(s, "/v1/tts", "timeout") == 1
    assert value(s, "tts_engine_errors_total") == 0


def test_engine_failure_mid_stream_counts_an_error(client, behaviour):
    behaviour.fail_at_chunk = 2
    behaviour.chunks = 4
    # After the first byte the stream can only be cut short; the test client re-raises that.
    body = {"text": "hi", "stream": True, "format": "pcm"}
    with pytest.raises(RuntimeError, match="response already started"), client.stream("POST", "/v1/tts", json=body) as r:
        assert r.status_code == 200
        for _ in r.iter_bytes():
            pass
    behaviour.fail_at_chunk = 0
    assert client.post("/v1/tts", json={"text": "hi"}).status_code == 500
    s = scrape(client)
    assert requests_total(s, "/v1/tts", "error") == 2
    assert value(s, "tts_engine_errors_total") == 2
    assert value(s, "tts_engine_jobs_total", outcome="error") == 2


async def _stream_then_disconnect(app, path: str, body: dict) -> list[dict]:
    """Drive the ASGI app by hand: read the first body chunk, then hang up."""
    sent: list[dict] = []
    first_body = asyncio.Event()
    payload = json.dumps(body).encode()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await first_body.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            first_body.set()

    # spec 2.3, as uvicorn sends: Starlette then watches receive() for the disconnect.
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
             "client": ("127.0.0.1", 1234), "server": ("test", 80),
             "state": {"runtime": app.state.runtime}}  # what the server copies from the lifespan's state
    await app(scope, receive, send)
    return sent


def test_client_leaving_mid_stream_counts_aborted(client, behaviour):
    behaviour.chunks = 50
    behaviour.chunk_delay_s = 0.02
    client.portal.call(_stream_then_disconnect, client.app, "/v1/tts", {"text": "long", "stream": True, "format": "pcm"})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and requests_total(scrape(client), "/v1/tts", "aborted") < 1:
        time.sleep(0.02)
    s = scrape(client)
    assert requests_total(s, "/v1/tts", "aborted") == 1
    assert requests_total(s, "/v1/tts", "ok") == 0
    assert value(s, "tts_engine_errors_total") == 0
    assert value(s, "tts_time_to_first_audio_seconds_count") == 1
    assert 0 < value(s, "tts_audio_seconds_total") < 50 * behaviour.chunk_s
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and value(scrape(client), "tts_engine_jobs_total", outcome="cancelled") < 1:
        time.sleep(0.02)
    assert value(scrape(client), "tts_engine_jobs_total", outcome="cancelled") == 1


def test_disabled_metrics_is_404(tmp_path, behaviour):
    settings = make_settings(tmp_path)
    settings = Settings(**{**settings.model_dump(), "metrics": {"enabled": False}})
    app = create_app(settings, engine_factory=lambda i: FakeEngine(behaviour))
    with TestClient(app) as client:
        assert app.state.runtime.metrics is None
        assert client.post("/v1/tts", json={"text": "hi"}).status_code == 200
        r = client.get("/metrics")
        assert r.status_code == 404


def test_each_app_has_its_own_registry(tmp_path):
    a, b = Metrics(process=False), Metrics(process=False)
    assert a.registry is not b.registry
    a.pool_observer().on_reject("queue_full")
    assert b"tts_rejected_total{reason=\"queue_full\"} 1.0" in a.render()
    assert b"tts_rejected_total{reason=\"queue_full\"} 0.0" in b.render()


@pytest.mark.parametrize("state, outcome", [
    ({"status": 200, "completed": True}, "ok"),
    ({"status": 200, "completed": False}, "aborted"),
    ({"status": 200, "completed": False, "stream_error": "EngineFailure"}, "error"),
    ({"status": 200, "completed": False, "stream_error": "DeadlineExceeded"}, "timeout"),
    ({"status": 200, "completed": False, "stream_error": "ClientStalled"}, "aborted"),  # read nothing: it left
    ({"status": 400, "completed": True}, "client_error"),
    ({"status": 422, "completed": True}, "client_error"),
    ({"status": 503, "completed": True}, "rejected"),
    ({"status": 504, "completed": True}, "timeout"),
    ({"status": 500, "completed": True}, "error"),
    ({"status": 0}, "error"),
    ({"status": 499, "completed": True}, "aborted"),
])
def test_outcome_mapping(state, outcome):
    assert outcome_of(RequestContext(**state)) == outcome


def test_a_failing_hook_never_breaks_a_request(tmp_path, behaviour):
    metrics = Metrics(process=False)
    metrics = Metrics(process=False, routes=("/v1/tts",))
    metrics.on_done(RequestContext(endpoint="/v1/tts", latency_s="not a number"))  # logged, not raised


def test_stage_seconds_and_the_access_log_show_where_time_went(client, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="cosyserve.access"):
        assert client.post("/v1/tts", json={"text": "hello", "format": "mp3"}).status_code == 200
        assert client.post("/v1/tts", json={"text": "hello", "stream": True, "format": "pcm"}).status_code == 200
    samples = scrape(client)
    # the fake engine has no model stages; the encoder (in the slot thread) is timed for every request
    assert value(samples, "tts_stage_seconds_count", stage="encode") == 2
    assert value(samples, "tts_stage_seconds_sum", stage="encode") > 0
    assert value(samples, "tts_stage_seconds_count", stage="flow") == 0
    assert ("tts_stage_seconds_bucket", (("le", "+Inf"), ("stage", "llm"))) in samples  # every stage is listed
    lines = [r.getMessage() for r in caplog.records if r.name == "cosyserve.access" and "/v1/tts" in r.getMessage()]
    assert len(lines) == 2 and all(" stages=encode=" in line for line in lines), lines


def test_gpu_memory_gauges_come_from_the_reader_and_are_absent_without_a_gpu():
    metrics = Metrics(process=False)

    def families() -> dict[str, list]:
        text = metrics.render().decode()
        return {f.name: f.samples for f in text_string_to_metric_families(text) if f.name.startswith("tts_gpu")}

    assert families() == {}  # no reader (a fake engine): no series
    metrics.watch_gpu_memory(lambda: {})
    assert families() == {}  # a CPU server: the reader reports no device
    readings = {"cuda:0": {"allocated": 3 * 2**30, "reserved": 4 * 2**30, "peak": 5 * 2**30},
                "cuda:1": {"allocated": 1, "reserved": 2, "peak": 3}}
    metrics.watch_gpu_memory(lambda: readings)
    got = {(s.name, s.labels["device"]): s.value for samples in families().values() for s in samples}
    assert got == {("tts_gpu_memory_allocated_bytes", "cuda:0"): 3 * 2**30,
                   ("tts_gpu_memory_reserved_bytes", "cuda:0"): 4 * 2**30,
                   ("tts_gpu_memory_peak_bytes", "cuda:0"): 5 * 2**30,
                   ("tts_gpu_memory_allocated_bytes", "cuda:1"): 1.0,
                   ("tts_gpu_memory_reserved_bytes", "cuda:1"): 2.0,
                   ("tts_gpu_memory_peak_bytes", "cuda:1"): 3.0}

    def broken() -> dict:
        raise RuntimeError("driver hiccup")

    metrics.watch_gpu_memory(broken)
    assert families() == {} and b"tts_slots" in metrics.render()  # the scrape still works


def test_llm_prefill_forwards_observe_their_joiners_and_seconds():
    metrics = Metrics(process=False)
    observer = metrics.llm_observer()
    observer.on_prefill(16, 0.04)
    observer.on_prefill(3, 0.01)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    assert value(samples, "tts_llm_prefill_batch_size_count") == 2
    assert value(samples, "tts_llm_prefill_batch_size_sum") == 19
    assert value(samples, "tts_llm_prefill_batch_size_bucket", le="4.0") == 1
    assert value(samples, "tts_llm_prefill_seconds_count") == 2
    assert value(samples, "tts_llm_prefill_seconds_sum") == pytest.approx(0.05)
    assert value(samples, "tts_llm_prefill_seconds_bucket", le="0.025") == 1


def test_flow_rounds_are_observed_as_token2wav_batch_size_and_round_seconds():
    metrics = Metrics(process=False)
    observer = metrics.llm_observer()  # the engines' observer: LLM steps and, with token2wav batching, flow rounds
    observer.on_flow_round(3, 0.2)
    observer.on_flow_round(1, 0.05)
    samples = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert value(samples, "tts_token2wav_batch_size_count") == 2 and value(samples, "tts_token2wav_batch_size_sum") == 4
    assert value(samples, "tts_token2wav_batch_size_bucket", le="2.0") == 1
    assert value(samples, "tts_token2wav_round_seconds_count") == 2
    assert abs(value(samples, "tts_token2wav_round_seconds_sum") - 0.25) < 1e-9
