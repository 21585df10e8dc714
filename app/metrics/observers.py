"""The hooks the pool and the engines call (``PoolObserver``, ``LLMObserver``, ``FlowObserver``), bound to
one ``Metrics``: plain increments on children created up front."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.serving.admission.classes import NAMES as PRIORITIES
from app.serving.observer import JOB_OUTCOMES, REJECT_REASONS

if TYPE_CHECKING:
    from app.metrics.registry import Metrics


class PoolMetrics:
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


class EngineMetrics:
    """The engines' LLMObserver (called from the LLM scheduler or CosyVoice's LLM threads) and FlowObserver
    (called from the flow scheduler thread with token2wav batching)."""

    def __init__(self, metrics: Metrics) -> None:
        self._batch = metrics.llm_batch_size
        self._step = metrics.llm_step
        self._tokens = metrics.llm_tokens
        self._prefill_batch = metrics.llm_prefill_batch_size
        self._prefill = metrics.llm_prefill
        self._flow_recomputed = metrics.flow_cache_recomputed
        self._flow_cache = (metrics.flow_cache_bytes, metrics.flow_cache_budget, metrics.flow_cache_streams)
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

    def on_flow_cache_usage(self, held: int, budget: int, streams: int) -> None:
        for gauge, value in zip(self._flow_cache, (held, budget, streams), strict=True):
            gauge.set(value)
