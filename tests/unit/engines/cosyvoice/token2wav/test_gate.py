"""PriorityGate: at most ``limit`` holders; freed places go to the oldest request, first chunks with a bounded lead."""

from __future__ import annotations

import threading
import time

import pytest

from app.engines.cosyvoice.token2wav.gate import PriorityGate
from tests.support.waiting import wait_until


def test_limit_must_be_positive():
    with pytest.raises(ValueError):
        PriorityGate(0)


def _served_order(gate: PriorityGate, waiters: list[tuple]) -> list[str]:
    """Queue ``waiters`` (name, chunk index, request start[, bulk]) behind a holder, in list order; the order served."""
    assert gate.acquire(5, -100.0)  # a holder: everyone else waits
    order: list[str] = []
    threads = []
    for name, chunk, started, *bulk in waiters:
        def run(name=name, chunk=chunk, started=started, bulk=bool(bulk and bulk[0])):
            assert gate.acquire(chunk, started, bulk=bulk)
            order.append(name)
            gate.release()

        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        wait_until(lambda n=len(threads): gate.waiting == n)
    gate.release()
    for t in threads:
        t.join(5)
    return order


def test_oldest_request_first_and_a_first_chunk_leads_by_a_bounded_time():
    gate = PriorityGate(1, first_chunk_lead_s=1.0)
    order = _served_order(gate, [
        ("late-chunk of t=1.0", 3, 1.0),
        ("first of t=2.0", 0, 2.0),   # ranks as 1.0: after t=1.0's later chunk (FIFO among equals)
        ("first of t=1.5", 0, 1.5),   # ranks as 0.5: ahead of the later chunks of t=0.6 and t=1.0
        ("second of t=0.6", 1, 0.6),
        ("second of t=0.4", 1, 0.4),  # older than t=1.5 by more than the lead: not passed
        ("first of t=9.0", 0, 9.0),   # a much later newcomer waits behind every older stream
    ])
    assert order == ["second of t=0.4", "first of t=1.5", "second of t=0.6", "late-chunk of t=1.0",
                     "first of t=2.0", "first of t=9.0"]
    assert gate.max_running == 1


def test_without_a_lead_the_gate_is_fifo_across_requests():
    gate = PriorityGate(1, first_chunk_lead_s=0.0)
    order = _served_order(gate, [("first of t=3", 0, 3.0), ("fourth of t=1", 4, 1.0), ("first of t=2", 0, 2.0)])
    assert order == ["fourth of t=1", "first of t=2", "first of t=3"]


def test_a_started_stream_is_passed_only_by_requests_that_began_within_the_lead():
    """Starvation bound: newcomers' first chunks keep arriving; an old stream's next chunk still gets its turn."""
    gate = PriorityGate(1, first_chunk_lead_s=0.5)
    newcomers = [(f"first of t={t:.1f}", 0, t) for t in (10.2, 10.4, 10.6, 11.0, 12.0, 13.0)]
    order = _served_order(gate, [("next chunk of t=10", 2, 10.0), *newcomers])
    # only the newcomers that began within 0.5 s after the stream (t=10.2, 10.4) go first
    assert order[:3] == ["first of t=10.2", "first of t=10.4", "next chunk of t=10"]


def test_rank_and_lead_validation():
    gate = PriorityGate(2, first_chunk_lead_s=0.25)
    assert gate.rank(0, 5.0) == 4.75 and gate.rank(3, 5.0) == 5.0
    with pytest.raises(ValueError):
        PriorityGate(1, first_chunk_lead_s=-1.0)


def test_never_more_than_limit_hold_it():
    gate = PriorityGate(2)
    held = []
    lock = threading.Lock()
    peak = [0]

    def run(i: int) -> None:
        assert gate.acquire(i % 3, float(i))
        with lock:
            held.append(i)
            peak[0] = max(peak[0], len(held))
        time.sleep(0.002)
        with lock:
            held.remove(i)
        gate.release()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak[0] == 2 and gate.max_running == 2 and gate.waiting == 0


def test_a_cancelled_waiter_leaves_without_taking_a_place():
    gate = PriorityGate(1)
    assert gate.acquire(0, 0.0)
    cancel = threading.Event()
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(gate.acquire(0, 1.0, cancel)))
    t.start()
    wait_until(lambda: gate.waiting == 1)
    cancel.set()
    t.join(5)
    assert result == [False] and gate.waiting == 0
    gate.release()
    assert gate.acquire(0, 2.0, threading.Event())  # the place is free again


def test_interactive_hops_go_before_bulk_ones_then_the_oldest_first():
    gate = PriorityGate(1, first_chunk_lead_s=1.0)
    order = _served_order(gate, [
        ("bulk second of t=0", 1, 0.0, True),
        ("bulk first of t=0.5", 0, 0.5, True),  # its lead applies among bulk calls only
        ("interactive later chunk of t=5", 3, 5.0),
        ("interactive first of t=9", 0, 9.0),
        ("bulk first of t=0.2", 0, 0.2, True),
    ])
    assert order == ["interactive later chunk of t=5", "interactive first of t=9",
                     "bulk first of t=0.2", "bulk first of t=0.5", "bulk second of t=0"]


def test_a_running_bulk_call_is_not_interrupted():
    gate = PriorityGate(1)
    assert gate.acquire(0, 0.0, bulk=True)  # a bulk hop holds the place
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(gate.acquire(0, 1.0)))
    t.start()
    wait_until(lambda: gate.waiting == 1)
    assert got == [] and gate.max_running == 1  # the interactive hop waits for it
    gate.release()
    t.join(5)
    assert got == [True]
