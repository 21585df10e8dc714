"""The waiting room: who may wait for a place, and how long a newcomer would wait.

A request that cannot run at once may wait (FIFO) if its wait, the work beyond the limit and
its own place drained at the measured rate, is at most one round of the running ones
(limit / rate), or if that wait plus its service stays within the budget; never past
``max_wait_s`` (the pool's queue timeout would refuse it after the wait anyway). With an
operator's budget (a promise) only the budget test admits a wait.
"""

from __future__ import annotations

from app.serving.admission.limit.baseline import DEADBAND

WAIT_ROUNDS = 1.0  # one round of waiting keeps the places busy between Poisson arrivals (bench/queueing.py at 5983ddc)
EPS = 1e-9  # float slack on comparisons of loads and times


class WaitingRoom:
    def __init__(self, max_wait_s: float | None = None, promise: bool = False) -> None:
        self.max_wait_s = max_wait_s
        self.promise = promise  # the budget is the operator's: only it admits a wait

    @staticmethod
    def runs_at_once(load: float, weight: float, limit: int) -> bool:
        """An idle server always has room; else the request must fit within the limit."""
        return load <= 0 or load + weight <= limit + EPS

    @staticmethod
    def wait_s(load: float, weight: float, limit: int, rate: float) -> float:
        """The work beyond the limit, and the request's own place, drained at ``rate`` a second."""
        return (max(0.0, load - limit) + weight) / rate

    def admits(self, load: float, weight: float, limit: int, rate: float | None, target: float | None) -> bool:
        """May a request of ``weight`` arriving on ``load`` run or wait, at ``rate`` a second finished?"""
        if self.runs_at_once(load, weight, limit):
            return True
        if target is None or rate is None:
            return False  # nothing measured yet: no waiting room
        wait = self.wait_s(load, weight, limit, rate)
        if self.max_wait_s is not None and wait > self.max_wait_s:
            return False
        round_s = limit / rate  # the running ones all finish once (Little's law)
        if not self.promise and wait <= WAIT_ROUNDS * round_s * (1.0 + EPS):
            return True
        return wait + weight * round_s <= target * (1.0 + DEADBAND)

    def predicted_wait_s(self, load: float, weight: float, limit: int, rate: float | None,
                         target: float | None) -> float:
        """0 if it runs at once; unmeasured, the limit is assumed to finish once per target (or second)."""
        if self.runs_at_once(load, weight, limit):
            return 0.0
        return self.wait_s(load, weight, limit, rate if rate is not None else limit / (target or 1.0))
