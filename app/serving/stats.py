"""Observation hooks and service-time bookkeeping for the engine pool.

``PoolObserver`` is how the metrics layer (Prometheus, in ``app/``) learns what
the pool does without the pool importing it. ``ServiceTimeEstimator`` keeps an
exponential moving average of recent job durations and turns it into the
``Retry-After`` hint sent with 503 answers.
"""

from __future__ import annotations

import logging
import math
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)

REJECT_REASONS: tuple[str, ...] = ("queue_full", "over_budget", "queue_timeout", "draining", "not_ready",
                                   "bulk_queue_full", "bulk_timeout")
JOB_OUTCOMES: tuple[str, ...] = ("ok", "cancelled", "error", "timeout")


@runtime_checkable
class PoolObserver(Protocol):
    """Optional hooks, all called on the event loop thread; they must not block."""

    def on_reject(self, reason: str) -> None: ...  # one of REJECT_REASONS

    def on_queue_wait(self, seconds: float) -> None: ...

    def on_job_start(self) -> None: ...

    def on_job_end(self, outcome: str, seconds: float) -> None: ...  # one of JOB_OUTCOMES

    def on_queue_depth(self, depth: int) -> None: ...

    def on_class_wait(self, priority: str, seconds: float) -> None: ...  # admission (bulk: its queue) to a slot


class NullObserver:
    """The default observer: does nothing."""

    def on_reject(self, reason: str) -> None:
        pass

    def on_queue_wait(self, seconds: float) -> None:
        pass

    def on_job_start(self) -> None:
        pass

    def on_job_end(self, outcome: str, seconds: float) -> None:
        pass

    def on_queue_depth(self, depth: int) -> None:
        pass

    def on_class_wait(self, priority: str, seconds: float) -> None:
        pass


class SafeObserver:
    """Forwards to an observer; a failing hook is logged, never allowed to break serving."""

    def __init__(self, inner: PoolObserver) -> None:
        self._inner = inner

    def _call(self, name: str, *args: object) -> None:
        try:
            hook = getattr(self._inner, name, None)
            if hook is None:
                return  # an observer written before this hook existed
            hook(*args)
        except Exception:  # a metrics bug must not fail a request or leak a slot
            log.exception("pool observer hook %s failed", name)

    def on_reject(self, reason: str) -> None:
        self._call("on_reject", reason)

    def on_queue_wait(self, seconds: float) -> None:
        self._call("on_queue_wait", seconds)

    def on_job_start(self) -> None:
        self._call("on_job_start")

    def on_job_end(self, outcome: str, seconds: float) -> None:
        self._call("on_job_end", outcome, seconds)

    def on_queue_depth(self, depth: int) -> None:
        self._call("on_queue_depth", depth)

    def on_class_wait(self, priority: str, seconds: float) -> None:
        self._call("on_class_wait", priority, seconds)


class ServiceTimeEstimator:
    """EMA of recent service times, and the Retry-After estimate derived from it."""

    def __init__(self, alpha: float = 0.2, initial_s: float = 1.0, max_retry_after_s: float = 600.0) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self.initial_s = initial_s
        self.max_retry_after_s = max_retry_after_s
        self.samples = 0
        self._ema: float | None = None

    @property
    def average_s(self) -> float | None:
        """The moving average, or None before the first sample."""
        return self._ema

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, float(seconds))
        self.samples += 1
        self._ema = seconds if self._ema is None else self._ema + self.alpha * (seconds - self._ema)

    def retry_after(self, queued: int, workers: int) -> float:
        """Whole seconds until a request arriving now could plausibly be served (>= 1).

        Every worker first finishes its current job, then the ``queued`` requests
        are shared among the workers: about ``(1 + queued / workers)`` service times.
        """
        service = self._ema if self._ema is not None else self.initial_s
        estimate = service * (1.0 + max(0, queued) / max(1, workers))
        return float(min(self.max_retry_after_s, max(1, math.ceil(estimate))))
