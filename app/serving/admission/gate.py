"""``Gate``: admission for every traffic class, one limit with two partitions.

Interactive requests are the limit's first partition (``Admission``: a permit at once or 503;
long jobs in lanes beside it). Bulk requests are the second: they wait in their own queue
(``BulkQueue``: bounded, fair between clients) for a permit granted only into the room the
interactive partition leaves (``bulk_room``), as Netflix's partitioned limiter lends a
partition's unused share, except that here the interactive share is never lent back while
interactive work waits. Both partitions count against the one ceiling (``workers + max_queue``).

The gate is the only thing callers ask for a permit (the HTTP edge and the WebSocket session;
the pool for its own engine calls). The pool tells it when the doors open, close and when its
slots' cap may have risen (``refill``); nothing else of the pool's state leaks in here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from app.serving.admission.bulk import BulkAccount, BulkQueue
from app.serving.admission.classes import Priority, parse_priority
from app.serving.admission.interactive import Admission
from app.serving.admission.permits import Ticket
from app.serving.config import PoolConfig
from app.serving.errors import Draining, NotReady
from app.serving.observer import PoolObserver

DRAINING = "the server is draining and takes no new requests"


class Gate:
    """Permits for interactive and bulk work out of one limit; see the module docstring."""

    def __init__(self, config: PoolConfig, observer: PoolObserver, refill: Callable[[], None]) -> None:
        self.admission = Admission.for_pool(config, observer)
        self._workers = config.workers
        self._refill = refill
        self.bulk_account = BulkAccount(self.admission.clock, on_release=self._pump)
        self.bulk = BulkQueue(self.bulk_account, max_queue=config.bulk_max_queue,
                              timeout_s=config.bulk_queue_timeout_s, can_grant=self._bulk_fits,
                              reject=self.admission.reject, retry_after_s=self._bulk_retry_after_s)
        self.admission.on_change = self._changed  # a permit back, a size known, the limit moved
        self.admission.others = self.bulk_account  # a request beside bulk work did not run alone
        self.state = "loading"  # loading -> open -> draining; or failed

    # -- the doors ------------------------------------------------------------------------------
    def open(self) -> None:
        self.state = "open"

    def failed(self) -> None:
        self.state = "failed"

    def close(self) -> None:
        """Admit nothing more; the bulk requests still waiting for room get 503 draining at once."""
        self.state = "draining"
        for _ in range(self.bulk.drain(Draining(DRAINING, self.retry_after_s()))):
            self.admission.reject("draining")

    def _refuse_unless_open(self) -> None:
        if self.state == "draining":
            self.admission.reject("draining")
            raise Draining(DRAINING, self.retry_after_s())
        if self.state != "open":
            self.admission.reject("not_ready")
            raise NotReady("the engine is not loaded yet" if self.state == "loading" else "the engine failed to load")

    # -- permits --------------------------------------------------------------------------------
    def check(self, priority: Priority | str | None) -> None:
        """Raise Overloaded / Draining / NotReady (counted) if a request of ``priority`` would be refused
        now; take nothing. ``None`` (the class is not known before the body): refuse only if no class
        would admit: it passes while the bulk queue has a place (the body may name bulk)."""
        self._refuse_unless_open()
        if priority is None:
            if not self.bulk.full:
                return
        elif parse_priority(priority) is Priority.BULK:
            self.bulk.check()
            return
        self.admission.check()

    def admit_now(self) -> Ticket:
        """An interactive permit at once, or raise Overloaded / Draining / NotReady."""
        self._refuse_unless_open()
        return self.admission.admit()

    async def admit(self, priority: Priority | str, client: str = "") -> Ticket:
        """A permit for a request of class ``priority`` from ``client`` (an API key's id, else its address).

        Interactive: ``admit_now()``. Bulk: waits its turn in the bulk queue (fair between clients) for
        the room interactive work leaves, or raises Overloaded when that queue is full
        (``bulk_queue_full``) or its wait times out (``bulk_timeout``); Draining when the doors close
        meanwhile. A client that leaves (the task cancelled) leaves the queue at once.
        """
        if parse_priority(priority) is not Priority.BULK:
            return self.admit_now()
        self._refuse_unless_open()
        return await self.bulk.wait(client)

    def is_bulk(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` is a permit of the bulk partition."""
        return ticket.issued_by(self.bulk_account)

    def issued(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` is a permit of this gate (either partition)."""
        return ticket.issued_by(self.admission) or ticket.issued_by(self.bulk_account)

    def retry_after_s(self) -> float:
        return self.admission.retry_after_s()

    def start_at(self, limit: int) -> None:
        """Adaptive: the limit to start from (the lifespan picks it from the machine); waiters get slots."""
        self.admission.start_at(limit)  # its on_change refills the slots (_changed)

    def idle(self) -> bool:
        return self.admission.in_flight == 0 and self.bulk_account.in_flight == 0

    # -- the bulk partition ---------------------------------------------------------------------
    def bulk_room(self) -> int:
        """How many bulk requests may run (and compute) now: the places interactive work leaves.

        The admission limit (fixed: the capacity), no more than the workers (a waiting place is no
        room to compute in), minus the interactive load: its weighted load, and at least one place per
        interactive request in flight (each needs a slot, however short its text). The engine reads it
        too, from its own threads (``set_bulk_room``): plain reads of numbers, a moment stale at worst.
        """
        a = self.admission
        places = min(a.limit, self._workers)
        return max(0, math.floor(places - max(a.load, a.in_flight) + 1e-9))

    def _bulk_fits(self) -> bool:
        """One more bulk permit fits: within the room, the hard ceiling, and the doors open."""
        if self.state != "open":
            return False
        out = self.bulk_account.in_flight
        return out < self.bulk_room() and out + self.admission.in_flight < self.admission.capacity

    def _pump(self) -> None:
        self.bulk.pump()

    def _changed(self) -> None:
        self._refill()  # the slots' cap (limit + lanes) may have risen: waiters get idle slots
        self.bulk.pump()

    def _bulk_retry_after_s(self, depth: int) -> float:
        """The bulk queue ahead, drained by the places: about depth / places service times."""
        service = self.admission.average_service_s or 1.0
        places = max(1, min(self.admission.limit, self._workers))
        return float(min(600, max(1, math.ceil(service * (1 + depth / places)))))

    def class_stats(self, completed: dict[Priority, int]) -> dict:
        """Per traffic class: waiting, running, completed ok (and for bulk its queue's other counts)."""
        a, b, q = self.admission, self.bulk_account, self.bulk
        return {
            Priority.INTERACTIVE.value: {"queued": a.queued, "running": a.running,
                                         "completed": completed[Priority.INTERACTIVE]},
            Priority.BULK.value: {"queued": q.depth, "running": b.running, "in_flight": b.in_flight,
                                  "completed": completed[Priority.BULK], "granted": q.granted,
                                  "left": q.left, "clients": q.clients, "room": self.bulk_room(),
                                  "max_queue": q.max_queue, "timeout_s": q.timeout_s},
        }
