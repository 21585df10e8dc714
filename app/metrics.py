"""Prometheus metrics for one server instance, on a registry this object owns.

Three sources feed it, none of them a global:

* ``on_done(ctx)``: called by ``RequestContextMiddleware`` once per HTTP request
  with its ``RequestContext`` (streams included, after the last byte or the
  abort). Only the synthesis routes of the route table (``app/api/routes.py``,
  passed in as ``routes``, so cardinality stays bounded) count in
  ``tts_requests_total``; probes and ``/metrics`` are skipped.
* ``pool_observer()``: the ``PoolObserver`` hooks of the engine pool
  (rejections, queue wait, queue depth, engine jobs, the wait per traffic class).
* scrape time: a custom collector reads ``pool.stats()`` (slot states, admitted
  requests in flight, per traffic class: waiting, running, completed) and the process' peak RSS; prometheus_client's
  ``ProcessCollector`` adds ``process_resident_memory_bytes`` and friends;
  ``watch_gpu_memory(reader)`` adds the GPU memory gauges (``tts_gpu_memory_*_bytes``
  per device; absent while the reader reports no device, e.g. on a CPU server).

Every child series is created up front, so a request costs dictionary lookups
and counter increments, nothing else.
"""

from __future__ import annotations

import logging
import resource
import sys
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from app.api.auth import UNAUTHORIZED_REASONS
from app.api.context import RequestContext
from app.api.errors import CLIENT_GONE_STATUS
from app.engines.timings import STAGES
from app.serving.priority import NAMES as PRIORITIES
from app.serving.stats import JOB_OUTCOMES, REJECT_REASONS

log = logging.getLogger("cosyserve.metrics")

__all__ = ["CONTENT_TYPE_LATEST", "OUTCOMES", "SLOT_STATES", "Metrics", "outcome_of"]

OUTCOMES: tuple[str, ...] = ("ok", "client_error", "rejected", "timeout", "error", "aborted")
SLOT_STATES: tuple[str, ...] = ("loading", "idle", "busy", "failed", "closed")

# Buckets sized for TTS: milliseconds (a cached short answer) to minutes (a long text on CPU).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BULK_WAIT_BUCKETS = (300.0, 900.0, 1800.0, 3600.0)  # a bulk request may wait up to pool.bulk_queue_timeout_s
RTF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PREFILL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STREAM_TIMEOUT_ERRORS = frozenset({"DeadlineExceeded"})
STREAM_CLIENT_ERRORS = frozenset({"ClientStalled"})  # the client read nothing for server.send_timeout_s: it left
ENGINE_ERROR_CODES = frozenset({"engine_failure"})
WS_REFUSALS: tuple[str, ...] = ("session_limit", "draining")


def outcome_of(ctx: RequestContext) -> str:
    """Map what the middleware saw (status, completed, stream_error) to one of OUTCOMES."""
    status = int(ctx.status or 500)
    if status == CLIENT_GONE_STATUS:
        return "aborted"
    if status == 503:
        return "rejected"
    if status == 504:
        return "timeout"
    if 400 <= status < 500:
        return "client_error"
    if status >= 500:
        return "error"
    stream_error = ctx.stream_error
    if stream_error:  # headers were 2xx, then the stream broke on the server side
        if stream_error in STREAM_CLIENT_ERRORS:
            return "aborted"
        return "timeout" if stream_error in STREAM_TIMEOUT_ERRORS else "error"
    if not ctx.completed:
        return "aborted"  # the client left before the last byte
    return "ok"


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


class _ScrapeCollector:
    """Values read at scrape time: slot states and in-flight requests from the pool, peak RSS."""

    def __init__(self, stats: Callable[[], dict | None]) -> None:
        self._stats = stats

    def describe(self) -> Iterable[Metric]:
        return []  # no describe-time collection (the pool may not exist yet)

    def collect(self) -> Iterator[Metric]:
        slots = GaugeMetricFamily("tts_slots", "Engine slots by state", labels=["state"])
        inflight = GaugeMetricFamily("tts_inflight_requests",
                                     "Admitted synthesis requests: queued, running or still streaming")
        counts = dict.fromkeys(SLOT_STATES, 0)
        stats = None
        try:
            stats = self._stats()
        except Exception:  # a scrape must not fail because the pool is in a strange state
            log.exception("reading pool stats for /metrics failed")
        if stats:
            for slot in stats.get("slots", ()):
                state = slot.get("state", "")
                if state in counts:
                    counts[state] += 1
        for state, n in counts.items():
            slots.add_metric([state], n)
        classes = (stats or {}).get("classes") or {}
        bulk_out = (classes.get("bulk") or {}).get("in_flight", 0)
        inflight.add_metric([], float(stats.get("in_flight", 0) + bulk_out) if stats else 0.0)
        yield slots
        yield inflight
        yield GaugeMetricFamily("tts_slots_stuck", "Slots stuck in the engine past request_timeout_s + "
                                "stuck_grace_s (/health/live fails while any is)",
                                value=float(stats.get("stuck", 0)) if stats else 0.0)
        yield CounterMetricFamily("tts_stuck_jobs", "Jobs found stuck in the engine since start",
                                  value=float(stats.get("stuck_total", 0)) if stats else 0.0)
        yield GaugeMetricFamily("tts_process_peak_rss_bytes", "Peak resident set size of this process",
                                value=_peak_rss_bytes())
        yield from _admission_metrics((stats or {}).get("admission") or {})
        yield from _class_metrics(classes)


def _class_metrics(classes: dict) -> Iterator[Metric]:
    """Per traffic class (issue 39): waiting, running, completed; the bulk room and its leavers."""
    queued = GaugeMetricFamily("tts_class_queue_depth", "Requests waiting, per traffic class (interactive: "
                               "admitted, waiting for a slot; bulk: in the bulk queue, waiting for room)",
                               labels=["priority"])
    running = GaugeMetricFamily("tts_class_running", "Requests holding an engine slot (or still being "
                                "consumed), per traffic class", labels=["priority"])
    completed = CounterMetricFamily("tts_class_completed", "Engine jobs that ended ok, per traffic class "
                                    "(its rate: the class' throughput)", labels=["priority"])
    for name in PRIORITIES:
        c = classes.get(name) or {}
        queued.add_metric([name], float(c.get("queued", 0)))
        running.add_metric([name], float(c.get("running", 0)))
        completed.add_metric([name], float(c.get("completed", 0)))
    yield queued
    yield running
    yield completed
    bulk = classes.get("bulk") or {}
    yield GaugeMetricFamily("tts_bulk_room", "Bulk requests that may run now: the admission limit (at most the "
                            "workers) minus the interactive load", value=float(bulk.get("room", 0)))
    yield CounterMetricFamily("tts_bulk_left", "Bulk requests whose client left while they waited in the bulk "
                              "queue", value=float(bulk.get("left", 0)))


def _admission_metrics(adm: dict) -> Iterator[Metric]:
    """The admission gate's state (pool.admission adaptive or fixed; docs/concurrency.md)."""
    limit = GaugeMetricFamily("tts_admission_limit", "Requests (of average size) admitted at once now: the "
                              "adaptive limit, or workers + max_queue when fixed", labels=["mode"])
    if adm.get("mode"):
        limit.add_metric([adm["mode"]], float(adm.get("limit", 0)))
    yield limit
    yield GaugeMetricFamily("tts_admission_ceiling", "Most requests ever admitted at once (pool.workers + "
                            "pool.max_queue)", value=float(adm.get("ceiling", 0)))
    yield GaugeMetricFamily("tts_admission_load", "Admitted requests in flight, weighted by their size "
                            "(1 = an average request)", value=float(adm.get("load", 0.0)))
    yield GaugeMetricFamily("tts_admission_lanes", "Long jobs running in lanes beside the limit (a slot each, "
                            "none of the limit's load)", value=float(adm.get("lanes", 0)))
    yield GaugeMetricFamily("tts_admission_predicted_wait_seconds", "How long a request arriving now would "
                            "wait before it could start (0: at once; else it is refused with this Retry-After)",
                            value=float(adm.get("predicted_wait_s") or 0.0))
    for name, key, text in (
            ("tts_admission_target_latency_seconds", "target_s",
             "Adaptive: the latency budget of an average request (pool.admission_budget_s, or "
             "pool.admission_tolerance x the unloaded latency)"),
            ("tts_admission_unloaded_latency_seconds", "unloaded_s",
             "Adaptive: the latency of an average request that ran alone (median of recent ones)")):
        if adm.get(key) is not None:
            yield GaugeMetricFamily(name, text, value=float(adm[key]))


GPU_MEMORY = (("allocated", "GPU memory held by live tensors"),
              ("reserved", "GPU memory held by the caching allocator (live tensors and cached free blocks)"),
              ("peak", "Peak GPU memory held by live tensors since start"))


class _GpuMemoryCollector:
    """``tts_gpu_memory_{allocated,reserved,peak}_bytes{device}`` from a reader ({} on a CPU: no series)."""

    def __init__(self) -> None:
        self.reader: Callable[[], dict] | None = None

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        if self.reader is None:
            return
        try:
            devices = self.reader() or {}
        except Exception:  # a scrape must not fail on a driver hiccup
            log.exception("reading GPU memory for /metrics failed")
            return
        if not devices:
            return
        for kind, doc in GPU_MEMORY:
            family = GaugeMetricFamily(f"tts_gpu_memory_{kind}_bytes", doc, labels=["device"])
            for device, values in sorted(devices.items()):
                family.add_metric([device], float(values.get(kind, 0)))
            yield family


class _Observer:
    """The pool's PoolObserver: plain increments on pre-bound children (event-loop thread only)."""

    def __init__(self, metrics: Metrics) -> None:
        self._rejected = {r: metrics.rejected.labels(reason=r) for r in REJECT_REASONS}
        self._jobs = {o: metrics.engine_jobs.labels(outcome=o) for o in JOB_OUTCOMES}
        self._queue_wait = metrics.queue_wait
        self._queue_depth = metrics.queue_depth
        self._rejected_other = metrics.rejected
        self._class_wait = {p: metrics.class_wait.labels(priority=p) for p in PRIORITIES}

    def on_reject(self, reason: str) -> None:
        child = self._rejected.get(reason)
        (child if child is not None else self._rejected_other.labels(reason="other")).inc()

    def on_queue_wait(self, seconds: float) -> None:
        self._queue_wait.observe(seconds)

    def on_job_start(self) -> None:
        pass  # running jobs are visible as busy slots (tts_slots)

    def on_job_end(self, outcome: str, seconds: float) -> None:
        child = self._jobs.get(outcome)
        if child is not None:
            child.inc()

    def on_queue_depth(self, depth: int) -> None:
        self._queue_depth.set(depth)

    def on_class_wait(self, priority: str, seconds: float) -> None:
        child = self._class_wait.get(priority)
        if child is not None:
            child.observe(seconds)


class _LLMObserver:
    """The engines' LLMObserver (called from the LLM scheduler or CosyVoice's LLM threads) and FlowObserver
    (called from the flow scheduler thread with token2wav batching)."""

    def __init__(self, metrics: Metrics) -> None:
        self._batch = metrics.llm_batch_size
        self._step = metrics.llm_step
        self._tokens = metrics.llm_tokens
        self._prefill_batch = metrics.llm_prefill_batch_size
        self._prefill = metrics.llm_prefill
        self._flow_recomputed = metrics.flow_cache_recomputed
        self._flow_batch = metrics.token2wav_batch_size
        self._flow_round = metrics.token2wav_round

    def on_flow_round(self, batch_size: int, seconds: float) -> None:
        self._flow_batch.observe(batch_size)
        self._flow_round.observe(seconds)

    def on_step(self, batch_size: int, seconds: float) -> None:
        self._batch.observe(batch_size)
        self._step.observe(seconds)

    def on_prefill(self, joiners: int, seconds: float) -> None:
        self._prefill_batch.observe(joiners)
        self._prefill.observe(seconds)

    def on_tokens(self, n: int) -> None:
        self._tokens.inc(n)

    def on_flow_cache_recompute(self) -> None:
        self._flow_recomputed.inc()


class Metrics:
    """All metrics of one app instance, on ``self.registry`` (never the global default registry)."""

    def __init__(self, stats: Callable[[], dict | None] = lambda: None,
                 routes: Iterable[str] = (), process: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter("tts_requests_total", "Synthesis requests by route template and outcome",
                                ["endpoint", "outcome"], registry=r)
        self.rejected = Counter("tts_rejected_total", "Requests refused by admission control (503)",
                                ["reason"], registry=r)
        self.unauthorized = Counter("tts_unauthorized_total", "Requests and WebSocket handshakes refused with "
                                    "401 (server.api_keys)", ["reason"], registry=r)
        self.queue_depth = Gauge("tts_queue_depth", "Admitted requests waiting for an engine slot", registry=r)
        self.ws_sessions = Gauge("tts_ws_sessions", "Open WebSocket speech sessions (websocket.max_sessions)",
                                 registry=r)
        self.ws_refused = Counter("tts_ws_sessions_refused_total", "WebSocket sessions refused at connect "
                                  "(session_limit: websocket.max_sessions reached; draining)", ["reason"], registry=r)
        self.queue_wait = Histogram("tts_queue_wait_seconds", "Time from admission to an engine slot",
                                    buckets=WAIT_BUCKETS, registry=r)
        self.class_wait = Histogram("tts_class_wait_seconds", "Wait per traffic class: interactive, from admission "
                                    "to an engine slot; bulk, from joining the bulk queue to a slot",
                                    ["priority"], buckets=WAIT_BUCKETS + BULK_WAIT_BUCKETS, registry=r)
        self.ttfa = Histogram("tts_time_to_first_audio_seconds",
                              "Time from the engine job's start to its first audio chunk",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("tts_request_duration_seconds",
                                  "Synthesis request duration, from the first request byte to the last response byte",
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("tts_real_time_factor",
                             "Synthesis seconds (duration minus queue wait) per second of audio, successful requests",
                             buckets=RTF_BUCKETS, registry=r)
        self.audio_seconds = Counter("tts_audio_seconds", "Seconds of audio sent to clients", registry=r)
        self.engine_errors = Counter("tts_engine_errors", "Engine failures (before or after the first audio byte)",
                                     registry=r)
        self.engine_jobs = Counter("tts_engine_jobs", "Engine jobs by how their slot thread ended",
                                   ["outcome"], registry=r)
        self.llm_batch_size = Histogram("tts_llm_batch_size", "Sequences decoded together in one LLM step "
                                        "(1 per step without batching)", buckets=BATCH_BUCKETS, registry=r)
        self.llm_step = Histogram("tts_llm_step_seconds", "Duration of one LLM decode step (all its sequences)",
                                  buckets=STEP_BUCKETS, registry=r)
        self.llm_tokens = Counter("tts_llm_tokens", "Speech tokens produced by the LLM", registry=r)
        self.llm_prefill_batch_size = Histogram("tts_llm_prefill_batch_size", "Sequences prefilled together in "
                                                "one batched LLM prefill forward (joiners of one step)",
                                                buckets=BATCH_BUCKETS, registry=r)
        self.llm_prefill = Histogram("tts_llm_prefill_seconds", "Duration of one batched LLM prefill forward, "
                                     "its log-prob download included (the running batch waits for it)",
                                     buckets=PREFILL_BUCKETS, registry=r)
        self.flow_cache_recomputed = Counter("tts_flow_cache_recomputed_streams", "Streams that recompute their "
                                             "flow prefix because the flow cache budget "
                                             "(engine.flow_cache_budget_mb) was full", registry=r)
        self.token2wav_batch_size = Histogram("tts_token2wav_batch_size", "Flow calls (request hops) run together "
                                              "in one batched flow round (engine.token2wav_batch)",
                                              buckets=BATCH_BUCKETS, registry=r)
        self.token2wav_round = Histogram("tts_token2wav_round_seconds", "Duration of one batched flow round "
                                         "(token encoder + ODE over all its calls)", buckets=LATENCY_BUCKETS,
                                         registry=r)
        self.stage = Histogram("tts_stage_seconds", "Seconds one synthesis request spent per stage: frontend "
                               "(text, prompt features), llm (start to last token; overlaps flow/hift when "
                               "streaming), flow, hift, encode", ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self._stages = {s: self.stage.labels(stage=s) for s in STAGES}
        self._routes = {
            route: {o: self.requests.labels(endpoint=route, outcome=o) for o in OUTCOMES} for route in routes
        }
        for reason in REJECT_REASONS:
            self.rejected.labels(reason=reason)
        for outcome in JOB_OUTCOMES:
            self.engine_jobs.labels(outcome=outcome)
        for reason in UNAUTHORIZED_REASONS:
            self.unauthorized.labels(reason=reason)
        for reason in WS_REFUSALS:
            self.ws_refused.labels(reason=reason)
        r.register(_ScrapeCollector(stats))
        self._gpu = _GpuMemoryCollector()
        r.register(self._gpu)
        if process:
            ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu seconds, fds (Linux /proc)
        self._observer = _Observer(self)
        self._llm_observer = _LLMObserver(self)

    # -- sources --------------------------------------------------------------------------------
    def pool_observer(self) -> _Observer:
        return self._observer

    def llm_observer(self) -> _LLMObserver:
        return self._llm_observer

    def watch_gpu_memory(self, reader: Callable[[], dict]) -> None:
        """Report ``reader()``: ``{device: {"allocated": bytes, "reserved": bytes, "peak": bytes}}`` at each scrape."""
        self._gpu.reader = reader

    def on_ws_session(self, opened: bool) -> None:
        """A WebSocket speech session opened (True) or ended (False)."""
        if opened:
            self.ws_sessions.inc()
        else:
            self.ws_sessions.dec()

    def on_ws_refused(self, reason: str) -> None:
        """A WebSocket session refused at connect: one of WS_REFUSALS."""
        self.ws_refused.labels(reason=reason).inc()

    def on_unauthorized(self, reason: str) -> None:
        """The API key middleware's callback: ``missing_api_key`` or ``invalid_api_key``."""
        self.unauthorized.labels(reason=reason).inc()

    def on_done(self, ctx: RequestContext) -> None:
        """The middleware's per-request callback; never raises (a metrics bug must not fail requests)."""
        try:
            self._record(ctx)
        except Exception:
            log.exception("recording request metrics failed")

    def _record(self, ctx: RequestContext) -> None:
        if ctx.error_code in ENGINE_ERROR_CODES or (ctx.stream_error and ctx.stream_error not in STREAM_TIMEOUT_ERRORS):
            self.engine_errors.inc()
        by_outcome = self._routes.get(ctx.endpoint) if ctx.endpoint is not None else None
        if by_outcome is None:
            return  # not a synthesis route: probes, /metrics, listings, 404s
        outcome = outcome_of(ctx)
        by_outcome[outcome].inc()
        latency = ctx.latency_s
        if latency is None:
            return
        self.duration.observe(latency)
        if ctx.timings is not None:
            for stage, seconds in ctx.timings.snapshot().items():
                self._stages[stage].observe(seconds)
        if ctx.ttfa_s is not None:
            self.ttfa.observe(ctx.ttfa_s)
        audio_s = ctx.audio_s or 0.0
        if audio_s > 0:
            self.audio_seconds.inc(audio_s)
            if outcome == "ok":
                self.rtf.observe(max(0.0, latency - (ctx.queue_wait_s or 0.0)) / audio_s)

    # -- exposition -----------------------------------------------------------------------------
    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
