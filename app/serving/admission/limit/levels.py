"""What each level (a limit of n running) measured: its windows, throughput and latency, paired.

A level is judged by its last windows pooled (one window of a dozen requests cannot tell 2
running from 3 on a busy CPU), its throughput by Little's law from windows whose places were
kept busy. What a level gave is trusted for ``PROBE_AFTER_S`` seconds *of load*, so an idle
server's levels do not age, or, where requests are slow, until ``level_samples`` / ``PROBE_SHARE``
requests have finished under load since: measuring a level takes requests, not seconds, and a
model whose requests take 10 s would otherwise spend a third of its time re-measuring the level
below. Another level compares with n paired: relative to n's own windows measured within
``pair_s`` of it, since a shared host drifts more in a minute than neighbours differ.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import NamedTuple

from app.serving.admission.limit.baseline import DEADBAND

PROBE_AFTER_S = 300.0  # seconds of load a level is trusted: its neighbours are re-checked that often ...
PROBE_SHARE = 0.05  # ... or longer where requests are slow: re-checking costs at most this share of them
LEVEL_WINDOWS = 8  # a level is judged by its last this many windows pooled (more while they hold few requests)
HISTORY_WINDOWS = 600  # windows kept per level, for the paired comparisons
CLEAR_SAMPLES = 8  # a level clearly worse is known after this many requests ...
CLEAR_SHARE = 0.8  # ... "clearly": under this share of the best level fully known


class Window(NamedTuple):
    """What one window measured at a level."""

    median_s: float  # the median latency of its fresh samples
    at: float  # when it closed (the clock's time)
    samples: int
    mean_s: float  # their mean latency
    running: float | None  # the time-weighted running load, if the places were kept busy (else None)
    loaded_s: float  # seconds of load seen by then: what ages it ...
    loaded_n: int = 0  # ... and requests finished under load by then (``Levels.add`` stamps it)


class Levels:
    def __init__(self, level_samples: int = 24, pair_s: float = 3.0) -> None:
        self.level_samples = level_samples  # requests a level's throughput needs to be known
        self.pair_s = pair_s
        self._levels: dict[int, deque[Window]] = {}
        self.loaded_s = 0.0  # seconds of windows whose places were kept busy: the clock levels age by ...
        self.loaded_n = 0  # ... and the requests in them (where requests are slow, the longer of the two)
        self._verdicts: dict[int, float] = {}  # level -> its last window's time when it was clearly worse

    def add(self, level: int, window: Window) -> None:
        if window.running is not None:
            self.loaded_n += window.samples
        window = window._replace(loaded_n=self.loaded_n)
        self._levels.setdefault(level, deque(maxlen=HISTORY_WINDOWS)).append(window)

    def __iter__(self):
        return iter(self._levels)

    def _trusted(self, w: Window) -> bool:
        return (self.loaded_s - w.loaded_s <= PROBE_AFTER_S
                or self.loaded_n - w.loaded_n <= self.level_samples / PROBE_SHARE)

    def _windows(self, level: int) -> list[Window]:
        """``level``'s last trusted windows: ``LEVEL_WINDOWS`` of them, and more while they hold fewer than
        ``level_samples`` requests (where requests are slow a window closes on a few; read from the end:
        it is asked often). A window that was not kept busy still counts: a light spell displaces what
        the last overload measured, as the windows of fast requests do."""
        last: list[Window] = []
        samples = 0
        for w in reversed(self._levels.get(level, ())):
            if not self._trusted(w):
                break  # the older ones are older still
            if len(last) >= LEVEL_WINDOWS and samples >= self.level_samples:
                break
            last.append(w)
            samples += w.samples
        return last[::-1]

    def missed(self, level: int, target: float) -> bool:
        """``level`` has trusted windows and their latency missed the target."""
        windows = self._windows(level)
        return bool(windows) and statistics.median(w.median_s for w in windows) > target * (1.0 + DEADBAND)

    def throughput(self, level: int, strict: bool = False) -> float | None:
        """Requests a second at ``level``, once its busy windows hold ``level_samples`` requests, or already
        ``CLEAR_SAMPLES`` when it is clearly worse: a probe far off the knee need not dwell there. That
        verdict stands while the level's windows are the same (else the best level's wobble would make
        it unknown again, and the probe would start over)."""
        busy = [w for w in self._windows(level) if w.running is not None]
        if not busy:
            return None
        count, rate = _pooled(busy)
        if count >= self.level_samples:
            return rate
        if strict or count < CLEAR_SAMPLES:
            return None
        if self._verdicts.get(level) == busy[-1].at:
            return rate
        others = [x for k in self._levels if k != level and (x := self.throughput(k, strict=True)) is not None]
        if others and rate < CLEAR_SHARE * max(others):
            self._verdicts[level] = busy[-1].at
            return rate
        return None

    def rate(self, n: int) -> float | None:
        """Requests finished a second at ``n``: measured there, else the best of another level (one above
        scaled by n / k: each runs no slower with fewer running), else None."""
        here = self.throughput(n)
        if here is not None:
            return here
        measured = [x * min(1.0, n / k) for k in self._levels if (x := self.throughput(k)) is not None]
        return max(measured) if measured else None

    def _near(self, n: int, level: int) -> float | None:
        """``n``'s throughput from its busy windows within ``pair_s`` of ``level``'s, once they hold enough."""
        times = [w.at for w in self._windows(level) if w.running is not None]
        near = [w for w in self._levels.get(n, ()) if self._trusted(w) and w.running is not None
                and any(abs(w.at - t) <= self.pair_s for t in times)]
        if not near:
            return None
        count, rate = _pooled(near)
        return rate if count >= self.level_samples else None

    def paired(self, n: int) -> dict[int, float | None]:
        """Every level's throughput as seen from ``n``: another's relative to ``n``'s measured next to it,
        times ``n``'s latest; unpaired when ``n`` has no windows next to it."""
        xs = {k: self.throughput(k) for k in self._levels}
        here = xs.get(n)
        for k, x in xs.items():
            if x is not None and here is not None and k != n and (then := self._near(n, k)) is not None:
                xs[k] = x * here / then
        return xs


def _pooled(busy: list[Window]) -> tuple[int, float]:
    """Requests in busy windows and their throughput pooled: mean running load over mean latency."""
    count = sum(w.samples for w in busy)
    running = sum(w.running * w.samples for w in busy) / count  # type: ignore[operator]
    return count, running / (sum(w.mean_s * w.samples for w in busy) / count)
