"""``Limit``: what admission asks of a limit, whichever kind (``fixed.py``, ``adaptive.py``).

Loads are in average-size requests (weights); ``running`` and ``queued`` count permits.
Everything runs on the event-loop thread.
"""

from __future__ import annotations

from typing import Protocol


class Limit(Protocol):
    name: str  # "fixed" | "adaptive": the mode in stats and /metrics

    @property
    def value(self) -> int:
        """Requests (of average size) run at once now."""

    @property
    def target_s(self) -> float | None:
        """The latency budget of an average request, if this limit has one."""

    @property
    def unloaded_s(self) -> float | None:
        """The latency of a request running alone, if this limit measures it."""

    @property
    def average_s(self) -> float | None:
        """The latency (or service time) of an average request now."""

    def allows(self, load: float, weight: float = 1.0) -> bool:
        """Admit a request of ``weight`` on top of ``load`` (all admitted, running or waiting)?"""

    def predicted_wait_s(self, load: float, weight: float = 1.0) -> float:
        """Seconds a request arriving now would wait to run (0: at once)."""

    def retry_after_s(self, wait_s: float) -> float:
        """The Retry-After of a refusal (whole seconds, at least 1), given the predicted wait."""

    def observe(self, latency_s: float, *, admitted_at: float, alone: bool = False) -> None:
        """One finished request's latency, per unit of size."""

    def note_load(self, load: float, running: int | None = None, queued: int = 0) -> None:
        """The admitted load and counts, after every change to them."""

    def note_refused(self) -> None:
        """A request this limit refused."""

    def start_at(self, limit: int) -> None:
        """Where to start (the lifespan picks it from the machine); a fixed limit stays put."""
