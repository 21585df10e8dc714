"""Permits and tickets: what a gate hands out for one admitted request.

A ticket is an owned handle on one permit (TEI's ``OwnedSemaphorePermit``):
exactly one holder has it at a time. ``take()`` moves the permit to a new
handle for the next holder and leaves the old one empty; ``release()`` gives
the permit back. Every holder follows one rule: move the ticket on with
``take()``, or release it when done. Releasing an empty (moved-from) handle does
nothing, as dropping a moved value does; releasing a handle twice, or moving a
released one, is a bug in its holders: it is counted (``ticket_misuses`` in the
pool's stats), logged and raised as :class:`PermitError`.

The holders of one request's permit, in order: the edge (``RequestContext``,
or a WebSocket session), the speech service, the pool's ``run``, and the
``Job``, which releases it once its slot thread has returned and its consumer is
done. A holder that never hands it on (a request refused while parsing, a
session that ends before it speaks) releases it itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.serving.admission.interactive import Admission


class PermitError(RuntimeError):
    """A ticket released twice, or moved after it was moved or released: a bug in its holders."""


class Permit:
    """One admitted request. ``queued`` until its holder gets a slot; ``weight`` in average requests."""

    __slots__ = ("admission", "admitted_at", "first_alone", "in_lane", "others_at", "queued", "sampled", "serial",
                 "weight")

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.admitted_at = admission.clock()
        self.queued = True
        self.weight = 1.0  # an average request until charge() says otherwise
        self.serial = 0  # the start count when it started (0: not started)
        self.first_alone = False  # nothing else was running when it started
        self.sampled = True  # its latency is a capacity sample (exclude() turns it off)
        self.others_at = 0  # the other class's start count when it started (alone: unchanged at its end)
        self.in_lane = False  # a long job in a lane beside the limit (Admission.lanes)


class Ticket:
    """An owned handle on one admission permit: held, then moved on (``take``) or released, once."""

    __slots__ = ("_permit", "_state")

    def __init__(self, permit: Permit) -> None:
        self._permit = permit
        self._state = "held"  # held -> moved | released

    @property
    def held(self) -> bool:
        """This handle holds its permit (it was neither moved on nor released)."""
        return self._state == "held"

    @property
    def permit(self) -> Permit:
        """The permit itself, for the admission that issued it (its counts and samples)."""
        return self._permit

    @property
    def admitted_at(self) -> float:
        return self._permit.admitted_at

    def issued_by(self, admission: Admission) -> bool:
        return self._permit.admission is admission

    def take(self) -> Ticket:
        """Move the permit to a new handle (the next holder's); this one is left empty."""
        self._check("take")
        self._state = "moved"
        return Ticket(self._permit)

    def charge(self, units: float) -> None:
        """Its size, once known (text characters): its weight becomes ``units`` / the average size."""
        self._check("charge")
        self._permit.admission.permit_charged(self._permit, units)

    def exclude(self) -> None:
        """Its latency says nothing about capacity (text arriving over time, other engine work)."""
        self._check("exclude")
        self._permit.sampled = False

    def open_ended(self) -> None:
        """Its text arrives over time (a WebSocket utterance): no latency sample, and a long job (a lane)."""
        self._check("open_ended")
        self._permit.admission.permit_open_ended(self._permit)

    @property
    def in_lane(self) -> bool:
        return self._permit.in_lane

    def pause_s(self, worked_s: float, ahead_s: float) -> float:
        """How long its holder pauses after a piece of engine work that took ``worked_s``, its audio ``ahead_s``
        ahead of real time (a lane job beside short requests yields: ``Admission.lane_pause_s``); from any thread."""
        return self._permit.admission.lane_pause_s(self._permit, worked_s, ahead_s)

    @property
    def weight(self) -> float:
        return self._permit.weight

    @property
    def enqueued_at(self) -> float | None:
        """When a bulk permit's request joined its queue (its wait counts from there); None for others."""
        return getattr(self._permit, "enqueued_at", None)

    def started(self) -> None:
        """The holder got a slot: the permit leaves the queue (and counts as running)."""
        self._check("start")
        if self._permit.queued:
            self._permit.queued = False
            self._permit.admission.permit_started(self._permit)

    def release(self) -> None:
        """Give the permit back. A moved-from handle: nothing to do. A released one: PermitError."""
        if self._state == "moved":
            return
        self._check("release")
        self._state = "released"
        self._permit.admission.permit_released(self._permit)

    def _check(self, what: str) -> None:
        if self._state != "held":
            self._permit.admission.permit_misused(what, self._state)
