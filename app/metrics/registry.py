"""``Metrics``: every metric of one server instance, on a registry it owns (never the global one).

Three sources feed it, none of them a global:

* ``on_done(ctx)``: called by ``RequestContextMiddleware`` once per HTTP request
  with its ``RequestContext`` (streams included, after the last byte or the
  abort). Only the synthesis routes of the route table (``app/api/routes.py``,
  passed in as ``routes``, so cardinality stays bounded) count in
  ``tts_requests_total``; probes and ``/metrics`` are skipped.
* ``pool_observer()`` / ``llm_observer()``: the hooks of the pool and the engines (``observers.py``).
* scrape time: ``scrape.py`` reads ``pool.stats()``, ``gpu.py`` the GPU memory; prometheus_client's
  ``ProcessCollector`` adds ``process_resident_memory_bytes`` and friends.

Every child series is created up front, so a request costs dictionary lookups
and counter increments, nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
)
from prometheus_client.exposition import generate_latest

from app.api.auth import UNAUTHORIZED_REASONS
from app.api.context import RequestContext
from app.api.errors import CLIENT_GONE_STATUS
from app.engines.timings import STAGES
from app.metrics.gpu import GpuMemoryCollector
from app.metrics.observers import EngineMetrics, PoolMetrics
from app.metrics.scrape import PoolCollector
from app.serving.observer import JOB_OUTCOMES, REJECT_REASONS

log = logging.getLogger("cosyserve.metrics")

OUTCOMES: tuple[str, ...] = ("ok", "client_error", "rejected", "timeout", "error", "aborted")

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
WYOMING_MODES: tuple[str, ...] = ("synthesize", "stream")  # one text; text streamed in (synthesize-start ...)
WYOMING_OUTCOMES: tuple[str, ...] = ("ok", "client_error", "rejected", "error")


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
        self.ws_cancels = Counter("tts_ws_cancels_total", "WebSocket input.cancel messages (barge-in), by whether "
                                  "an utterance was dropped (utterance) or none was in progress (none)", ["target"],
                                  registry=r)
        self.wyoming_connections = Gauge("tts_wyoming_connections", "Open Wyoming connections "
                                         "(wyoming.max_sessions)", registry=r)
        self.wyoming_refused = Counter("tts_wyoming_connections_refused_total", "Wyoming connections refused at "
                                       "connect (session_limit: wyoming.max_sessions reached; draining)",
                                       ["reason"], registry=r)
        self.wyoming_syntheses = Counter("tts_wyoming_syntheses_total", "Wyoming synthesis requests by mode "
                                         "(synthesize: one text; stream: synthesize-start ... synthesize-stop) "
                                         "and outcome (rejected: over capacity)", ["mode", "outcome"], registry=r)
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
        self.flow_cache_bytes = Gauge("tts_flow_cache_bytes", "Bytes the streams' flow caches hold (reserved for "
                                      "their next hop included)", registry=r)
        self.flow_cache_budget = Gauge("tts_flow_cache_budget_bytes", "What all streams' flow caches may hold "
                                       "together (engine.flow_cache_budget_mb, or sized at load)", registry=r)
        self.flow_cache_streams = Gauge("tts_flow_cache_streams", "Streams holding a flow cache now", registry=r)
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
        for target in ("utterance", "none"):
            self.ws_cancels.labels(target=target)
        for reason in WS_REFUSALS:
            self.wyoming_refused.labels(reason=reason)
        self._wyoming = {(m, o): self.wyoming_syntheses.labels(mode=m, outcome=o)
                         for m in WYOMING_MODES for o in WYOMING_OUTCOMES}
        r.register(PoolCollector(stats))
        self._gpu = GpuMemoryCollector()
        r.register(self._gpu)
        if process:
            ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu seconds, fds (Linux /proc)
        self._observer = PoolMetrics(self)
        self._llm_observer = EngineMetrics(self)

    # -- sources --------------------------------------------------------------------------------
    def pool_observer(self) -> PoolMetrics:
        return self._observer

    def llm_observer(self) -> EngineMetrics:
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

    def on_ws_cancel(self, dropped: bool) -> None:
        """An input.cancel handled: it dropped an utterance (True) or there was none (False)."""
        self.ws_cancels.labels(target="utterance" if dropped else "none").inc()

    def on_wyoming_connection(self, opened: bool) -> None:
        """A Wyoming connection opened (True) or ended (False)."""
        if opened:
            self.wyoming_connections.inc()
        else:
            self.wyoming_connections.dec()

    def on_wyoming_refused(self, reason: str) -> None:
        """A Wyoming connection refused at connect: one of WS_REFUSALS."""
        self.wyoming_refused.labels(reason=reason).inc()

    def on_wyoming_synthesis(self, mode: str, outcome: str) -> None:
        """A Wyoming request ended: mode in WYOMING_MODES, outcome in WYOMING_OUTCOMES."""
        child = self._wyoming.get((mode, outcome))
        if child is not None:
            child.inc()

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
