"""Admission: a non-blocking gate that hands out owned permits (or says 503 at once).

``Admission.admit()`` returns a :class:`Ticket` or raises ``Overloaded``; it never
waits, so a refusal costs next to nothing (TEI's ``try_acquire_permit``). Two modes:

* ``fixed``: ``workers + max_queue`` permits, a constant (``queue_full`` beyond).
* ``adaptive``: ``limit`` average-size requests run at once, where the limit follows
  measured latency (``app/serving/admission/limit/``); beyond it a request may wait (FIFO, for a slot the
  pool leases only within the limit) if its predicted latency stays within the budget,
  else it is refused as ``over_budget`` with a ``Retry-After`` from the predicted wait.
  Never more than ``workers + max_queue`` in flight. Size enters in two steps: at the edge, before the body is read, a
  request counts as one average request (the refusal stays free); once its plan is
  known its holder ``charge()``s its size (text characters), so a long text takes
  more of the limit and its latency is read per unit of size. Work whose latency says
  nothing about capacity (text that arrives over time, voice registration) is
  ``exclude()``d from the latency samples.

Long jobs ride in lanes beside the limit (issue 47): a permit charged at least ``LONG_WEIGHT``
average requests and ``LONG_MIN_UNITS`` characters, or held open while its text arrives
(``open_ended()``: a WebSocket utterance), is one stream of work that runs for tens of seconds:
it occupies one place of a batched engine for all that time, not ``weight`` places for an
average request's time. Counted by its weight against the limit it would turn every short
request away (503 ``over_budget``) or make it wait behind it; so up to ``limit`` such jobs
instead run in lanes of their own: each takes one slot beyond the limit's and nothing of the
gate's load, and short requests keep the limit's places. A long job beyond the lanes counts
against the gate as before. Lane jobs are no latency samples (they do not run in the limit's
places). And a lane job yields: while short requests are in flight it works ``LANE_SHARE`` of the
time, pausing after each piece of audio (``lane_pause_s``, applied by its slot thread), as long as its
audio stays ``LANE_LEAD_S`` ahead of real time, so a listener never waits for the pause. Docs:
docs/concurrency.md ("Long jobs").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from app.serving.admission.limit import AdaptiveLimit, FixedLimit, Limit
from app.serving.admission.limit.service_time import ServiceTimeEstimator
from app.serving.admission.permits import Permit, PermitError, Ticket
from app.serving.config import PoolConfig
from app.serving.errors import Overloaded
from app.serving.observer import PoolObserver

log = logging.getLogger(__name__)

LONG_WEIGHT = 4.0  # a job charged this many average requests (about 6x the mean size) ...
LONG_MIN_UNITS = 256  # ... and this many characters (several sentences: many engine segments) runs in a lane
LANE_SHARE = 0.25  # while short requests are in flight a lane job ahead of real time computes this share of the time
LANE_LEAD_S = 2.0  # ... while its audio is at least this far ahead of real time (a listener's buffer)
LANE_PAUSE_MAX_S = 1.0  # ... pausing at most this long after one piece of work


class _Others(Protocol):
    """Permits counted apart from this gate (the bulk class): how many run, how many ever started."""

    running: int
    starts: int


class _NoOthers:
    running = 0
    starts = 0


class Admission:
    """The permits of one pool, their counters and the Retry-After estimate. Event-loop thread only.

    ``ceiling``: ``workers + max_queue`` in flight, a fixed limit, refused past as ``queue_full``.
    ``limiter``: the limit in force (the mode): that same fixed one unless another is given, e.g. an
    adaptive one beneath it, refused past as ``over_budget``.
    """

    def __init__(self, workers: int, max_queue: int, observer: PoolObserver,
                 limiter: Limit | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = workers
        self.max_queue = max_queue
        self.capacity = workers + max_queue  # the hard ceiling, in requests
        self._service_times = ServiceTimeEstimator()
        self.ceiling = FixedLimit(workers, max_queue, self._service_times)
        self.limiter: Limit = limiter or self.ceiling
        self.clock = clock
        self._observer = observer
        self.in_flight = 0  # permits out: queued, running or still being consumed
        self.queued = 0  # permits whose holder waits for a slot
        self.load = 0.0  # the permits out, in average requests (their weights)
        self.lanes = 0  # long jobs in lanes beside the limit (their weight is not the gate's)
        self.lane_load = 0.0  # ... their weights
        self.lanes_running = 0  # ... of them holding a slot (or still being consumed)
        self.lane_paused_s = 0.0  # seconds lane jobs paused for short requests (lane_pause_s), of ended jobs
        self.admitted = 0
        self.starts = 0  # permits that got a slot (a request ran alone if no other started meanwhile)
        self.rejected: dict[str, int] = {}
        self.misuses = 0  # tickets released twice or moved after release (a bug if ever above 0)
        self._mean_units: float | None = None  # the average charged size
        self.on_change: Callable[[], None] = lambda: None  # the load or the limit may have moved (bulk.py)
        self.others: _Others = _NoOthers()  # work counted apart (bulk.py): a request beside it did not run alone
        self._idle = asyncio.Event()
        self._idle.set()

    @classmethod
    def for_pool(cls, config: PoolConfig, observer: PoolObserver) -> Admission:
        """Fixed, or adaptive with a limit bounded by the fixed capacity (``workers + max_queue``)."""
        limiter = AdaptiveLimit(config.adaptive) if config.adaptive is not None else None
        return cls(config.workers, config.max_queue, observer, limiter=limiter)

    def start_at(self, limit: int) -> None:
        """The limit to start from (the lifespan picks it from the machine), within 1..ceiling; fixed: stays."""
        self.limiter.start_at(max(1, min(self.capacity, limit)))
        self.on_change()

    @property
    def mode(self) -> str:
        return self.limiter.name

    @property
    def limit(self) -> int:
        """Requests (of average size) admitted at once now: the capacity, or the adaptive limit."""
        return self.limiter.value

    @property
    def gate_load(self) -> float:
        """The load the limit governs: every permit's weight but the long jobs' in lanes."""
        return max(0.0, self.load - self.lane_load)

    @property
    def slot_cap(self) -> int:
        """Slots that may be leased at once: the limit's places, and one per long job in a lane."""
        return self.limiter.value + self.lanes

    # -- the gate -----------------------------------------------------------------------------
    def check(self) -> None:
        """Raise Overloaded (counted) if ``admit()`` would refuse now; take nothing.

        The edge asks this before it reads a request's body, so a refusal under overload still
        costs no body read; the permit itself is taken only once the body is in (``admit``).
        """
        self._refuse_if_full()

    def admit(self) -> Ticket:
        """A ticket at once, or Overloaded (counted as ``queue_full`` or ``over_budget``)."""
        self._refuse_if_full()
        self.in_flight += 1
        self.queued += 1
        self.admitted += 1
        self.load += 1.0
        self._idle.clear()
        self._note_load()
        self._observer.on_queue_depth(self.queued)
        return Ticket(Permit(self))

    def _refuse_if_full(self) -> None:
        if not self.ceiling.allows(self.load):
            self.reject("queue_full")
            raise Overloaded(f"all {self.workers} workers are busy and {self.max_queue} requests are waiting",
                             self.retry_after_s())
        if not self.limiter.allows(self.gate_load):
            self.limiter.note_refused()
            self.reject("over_budget")
            raise Overloaded(f"{self.limiter.value} requests are running and the wait for a place would take "
                             f"this one past the server's latency budget or its queue timeout", self.retry_after_s())

    def reject(self, reason: str) -> None:
        """Count a refusal (one of ``stats.REJECT_REASONS``)."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self._observer.on_reject(reason)

    def predicted_wait_s(self) -> float:
        """How long a request arriving now would wait before it could start (0: at once)."""
        wait = self.limiter.predicted_wait_s(self.gate_load)
        if not self.ceiling.allows(self.load):  # at the ceiling: behind every busy worker, too
            wait = max(wait, self.ceiling.predicted_wait_s(self.load))
        return wait

    def retry_after_s(self) -> float:
        return self.limiter.retry_after_s(self.predicted_wait_s())

    def observe_service(self, seconds: float) -> None:
        """A job's service time, for the Retry-After estimate."""
        self._service_times.observe(seconds)

    def observe_latency(self, ticket: Ticket, latency_s: float) -> None:
        """A finished request's latency (queue wait + engine time, without time blocked on its client)."""
        permit = ticket.permit
        if not permit.sampled or permit.in_lane:  # a lane job did not run in the limit's places
            return
        alone = (permit.first_alone and self.starts == permit.serial  # ran with nothing else running,
                 and self.others.starts == permit.others_at)  # bulk included
        self.limiter.observe(latency_s / max(permit.weight, 1e-3), admitted_at=permit.admitted_at, alone=alone)
        self.on_change()

    @property
    def average_service_s(self) -> float | None:
        return self._service_times.average_s

    def snapshot(self) -> dict:
        """The admission state for stats and /metrics."""
        lim = self.limiter
        return {
            "mode": self.mode,
            "limit": self.limit,
            "ceiling": self.capacity,
            "load": round(self.load, 3),
            "lanes": self.lanes,
            "lane_paused_s": round(self.lane_paused_s, 3),
            "predicted_wait_s": self.predicted_wait_s(),
            "target_s": lim.target_s,
            "unloaded_s": lim.unloaded_s,
            "average_s": lim.average_s,
        }

    async def wait_idle(self, timeout: float | None) -> bool:
        """True once every permit is back (nothing queued, running or still being consumed)."""
        if self.in_flight == 0:
            return True
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return self.in_flight == 0
        return True

    # -- called by Ticket ------------------------------------------------------------------------
    def permit_charged(self, permit: Permit, units: float) -> None:
        units = max(1.0, float(units))
        mean = self._mean_units = units if self._mean_units is None else self._mean_units + 0.1 * (
            units - self._mean_units)
        weight = units / mean
        self.load += weight - permit.weight
        if permit.in_lane:
            self.lane_load += weight - permit.weight
        permit.weight = weight
        if weight >= LONG_WEIGHT and units >= LONG_MIN_UNITS:
            self._to_lane(permit)
        self._note_load()
        self.on_change()

    def _to_lane(self, permit: Permit) -> None:
        """A long job: into a lane beside the limit while fewer than ``limit`` are taken, else it stays
        in the gate (counted by its weight, as any request)."""
        if permit.in_lane or self.lanes >= self.limit:
            return
        permit.in_lane = True
        self.lanes += 1
        self.lane_load += permit.weight
        if not permit.queued:
            self.lanes_running += 1

    def permit_open_ended(self, permit: Permit) -> None:
        permit.sampled = False
        self._to_lane(permit)
        self._note_load()
        self.on_change()

    def lane_pause_s(self, permit: Permit, worked_s: float, ahead_s: float) -> float:
        """How long a lane job pauses after a piece of work that took ``worked_s``, its audio ``ahead_s``
        seconds ahead of real time: while short requests are in flight (admitted, queued or running, outside
        the lanes) and it is at least ``LANE_LEAD_S`` ahead, long enough that it works ``LANE_SHARE`` of the
        time, never falling behind that lead; else 0. From a slot thread: reads two counters, changes nothing."""
        if not permit.in_lane or self.in_flight - self.lanes <= 0 or ahead_s <= LANE_LEAD_S:
            return 0.0
        share = max(0.0, worked_s) * (1.0 - LANE_SHARE) / LANE_SHARE
        return min(LANE_PAUSE_MAX_S, share, ahead_s - LANE_LEAD_S)

    @property
    def running(self) -> int:
        """Permits holding a slot, or still being consumed (admitted and no longer queued)."""
        return self.in_flight - self.queued

    def _note_load(self) -> None:
        """Tell the limits the load and the counts after any change to them."""
        self.ceiling.note_load(self.load, self.running, self.queued)
        self.limiter.note_load(self.gate_load, self.running - self.lanes_running, self.queued)

    def permit_started(self, permit: Permit) -> None:
        self.starts += 1
        permit.serial = self.starts
        permit.first_alone = self.running == 0 and self.others.running == 0  # before it counts as running
        permit.others_at = self.others.starts
        if permit.in_lane:
            self.lanes_running += 1
        self._left_queue()

    def _left_queue(self) -> None:
        self.queued -= 1
        self._observer.on_queue_depth(self.queued)
        self._note_load()

    def permit_released(self, permit: Permit) -> None:
        self.in_flight -= 1
        self.load = max(0.0, self.load - permit.weight) if self.in_flight else 0.0
        if permit.in_lane:
            self.lanes -= 1
            self.lane_load = max(0.0, self.lane_load - permit.weight) if self.lanes else 0.0
            if not permit.queued:
                self.lanes_running -= 1
        if permit.queued:
            permit.queued = False
            self._left_queue()
        else:
            self._note_load()
        if self.in_flight == 0:
            self._idle.set()
        self.on_change()

    def permit_misused(self, what: str, state: str) -> None:
        self.misuses += 1
        log.error("admission ticket misused: %s on a ticket already %s", what, state, stack_info=True)
        raise PermitError(f"{what}() on an admission ticket that was already {state}")
