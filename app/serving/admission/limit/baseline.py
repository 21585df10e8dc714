"""The unloaded latency: what a request takes with nothing else running, and the budget it sets.

The median latency of the requests that ran alone (nothing else running from their start to
their end; at a limit of 1 every one does) within a horizon, since a shared host's speed
drifts and the knee search's probes re-measure it. Until one has, the lowest window median
seen stands in, and before any window the lowest latency: never a recent loaded one, or the
budget would rise with the load it admits.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable

UNLOADED_SAMPLES = 32  # lone latencies kept: their median shrugs off a few outliers
UNLOADED_HORIZON_S = 240.0  # ... and for this long: a shared host's speed drifts within minutes
DEADBAND = 0.1  # a latency within 10 % of the target meets it: a median of a dozen samples wobbles that much


class Baseline:
    """The unloaded latency and the target: ``budget_s`` if set, else ``tolerance`` x the unloaded latency."""

    def __init__(self, budget_s: float | None, tolerance: float, clock: Callable[[], float]) -> None:
        self.budget_s = budget_s
        self.tolerance = tolerance
        self._clock = clock
        self._alone: deque[tuple[float, float]] = deque(maxlen=UNLOADED_SAMPLES)  # (latency, when)
        self._lowest_s = math.inf  # stand-ins: the lowest sample ...
        self._lowest_window_s = math.inf  # ... and the lowest window median (since the start)

    def observe(self, latency_s: float, alone: bool = False) -> None:
        self._lowest_s = min(self._lowest_s, latency_s)
        if alone:
            self._alone.append((latency_s, self._clock()))

    def observe_window(self, median_s: float) -> None:
        """A window's median latency (under whatever load): the stand-in until a request runs alone."""
        self._lowest_window_s = min(self._lowest_window_s, median_s)

    @property
    def unloaded_s(self) -> float | None:
        horizon = self._clock() - UNLOADED_HORIZON_S
        lone = [x for x, when in self._alone if when >= horizon]
        if lone:
            return statistics.median(lone)
        for stand_in in (self._lowest_window_s, self._lowest_s):
            if stand_in < math.inf:
                return stand_in
        return None

    @property
    def target_s(self) -> float | None:
        if self.budget_s is not None:
            return self.budget_s
        unloaded = self.unloaded_s
        return None if unloaded is None else self.tolerance * unloaded
