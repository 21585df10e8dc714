"""``ServiceTimeEstimator``: an exponential moving average of recent job durations, and the
``Retry-After`` hint it gives a 503 (the fixed limit's, and the gate's before any rate is measured)."""

from __future__ import annotations

import math


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
