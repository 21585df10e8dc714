"""What the limiter simulations share: a fake clock and the limit's changes in a (time, limit) history."""

from __future__ import annotations

import math


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def changes(history: list[tuple[float, int]], lo: float, hi: float = math.inf) -> list[tuple[float, int]]:
    """(time, new limit) of every change in (lo, hi]."""
    out, last = [], None
    for t, v in history:
        if last is not None and v != last and lo < t <= hi:
            out.append((t, v))
        last = v
    return out
