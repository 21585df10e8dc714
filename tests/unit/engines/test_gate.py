"""PriorityGate: at most ``limit`` holders, freed places go to the most urgent waiter."""

from __future__ import annotations

import threading
import time

import pytest

from app.engines.cosyvoice.batching.gate import PriorityGate
from tests.waiting import wait_until


def test_limit_must_be_positive():
    with pytest.raises(ValueError):
        PriorityGate(0)


def test_first_chunks_go_before_later_chunks_then_fifo():
    gate = PriorityGate(1)
    assert gate.acquire(5, 0.0)  # a holder: everyone else waits
    order: list[str] = []
    threads = []
    # waiters arrive in this order; they must be served by (chunk index, request start)
    for name, chunk, started in [("late-chunk", 3, 1.0), ("first-b", 0, 2.0), ("first-a", 0, 1.5), ("second", 1, 0.5)]:
        def run(name=name, chunk=chunk, started=started):
            assert gate.acquire(chunk, started)
            order.append(name)
            gate.release()

        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        wait_until(lambda n=len(threads): gate.waiting == n)
    gate.release()
    for t in threads:
        t.join(5)
    assert order == ["first-a", "first-b", "second", "late-chunk"]
    assert gate.max_running == 1


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
