"""``FixedLimit``: ``workers`` running plus ``max_queue`` waiting, a constant sized by the operator.

It is also the hard ceiling under an adaptive limit (admission.py refuses past it as ``queue_full``).
"""

from __future__ import annotations

from app.serving.admission.limit.service_time import ServiceTimeEstimator


class FixedLimit:
    name = "fixed"
    target_s = None  # no budget: the operator sized it
    unloaded_s = None

    def __init__(self, workers: int, max_queue: int, service_times: ServiceTimeEstimator) -> None:
        self.workers = workers
        self.capacity = workers + max_queue
        self._service_times = service_times
        self._in_flight = 0  # permits out, running or queued (note_load)
        self._queued = 0

    @property
    def value(self) -> int:
        return self.capacity

    @property
    def average_s(self) -> float | None:
        return self._service_times.average_s

    def allows(self, load: float, weight: float = 1.0) -> bool:
        """Counts requests, whatever their size: room while fewer than the capacity are in flight."""
        return self._in_flight < self.capacity

    def predicted_wait_s(self, load: float = 0.0, weight: float = 1.0) -> float:
        """Every worker busy: they finish their jobs, then the queue ahead is shared among them."""
        if self._in_flight < self.workers:
            return 0.0
        service = self._service_times.average_s or self._service_times.initial_s
        return service * (1.0 + self._queued / max(1, self.workers))

    def retry_after_s(self, wait_s: float) -> float:
        return self._service_times.retry_after(self._queued, self.workers)

    def observe(self, latency_s: float, *, admitted_at: float, alone: bool = False) -> None:
        """Latency moves nothing here."""

    def note_load(self, load: float, running: int | None = None, queued: int = 0) -> None:
        self._in_flight = (running or 0) + queued
        self._queued = queued

    def note_refused(self) -> None:
        """Nothing to learn from a refusal."""

    def start_at(self, limit: int) -> None:
        """A fixed limit does not move."""
