"""Compute threads run below the event loop (app/engines/threads.py): a per-thread nice on Linux."""

from __future__ import annotations

import os
import threading

import pytest

from app.engines import threads
from app.engines.fake import FakeBehaviour, FakeEngine
from app.serving import EnginePool
from tests.support import configs
from tests.support.waiting import run

pytestmark = pytest.mark.skipif(not threads.supported(), reason="per-thread nice values are Linux's")


@pytest.fixture
def offset():
    before = threads.offset()
    yield threads.set_offset
    threads.set_offset(before)


def nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def in_new_thread() -> tuple[int | None, int]:
    out: dict = {}

    def body() -> None:
        out["returned"] = threads.lower_this_thread()
        out["nice"] = nice()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out["returned"], out["nice"]


def test_a_compute_thread_lowers_itself_and_only_itself(offset):
    mine = nice()
    offset(3)
    returned, theirs = in_new_thread()
    assert theirs == min(19, mine + 3) == returned
    assert nice() == mine  # the event loop's thread is untouched


def test_a_compute_thread_started_by_another_is_not_lowered_twice(offset):
    mine = nice()
    offset(3)
    out: dict = {}

    def outer() -> None:
        threads.lower_this_thread()
        out["inner"] = in_new_thread()  # started from a lowered thread: inherits +3, stays there

    t = threading.Thread(target=outer)
    t.start()
    t.join()
    assert out["inner"] == (min(19, mine + 3), min(19, mine + 3))


def test_offset_zero_leaves_threads_as_they_are_and_the_offset_is_clamped(offset):
    mine = nice()
    offset(0)
    assert in_new_thread() == (None, mine)
    offset(50)
    assert threads.offset() == 19
    offset(-4)
    assert threads.offset() == 0


def test_the_pool_slot_threads_run_below_the_thread_that_started_them(offset):
    mine = nice()
    offset(2)

    async def main() -> list[int]:
        pool = EnginePool(lambda i: FakeEngine(FakeBehaviour(), name=f"fake-{i}"), configs.pool(workers=2))
        await pool.start()
        try:
            return [os.getpriority(os.PRIO_PROCESS, t.native_id) for t in threading.enumerate()
                    if t.name.startswith("cosyserve-slot-")]
        finally:
            await pool.close()

    assert run(main()) == [min(19, mine + 2)] * 2


def comm(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


def test_a_compute_thread_is_named_for_the_kernel_without_the_prefix(offset):
    offset(0)  # named even when not lowered
    out: dict = {}

    def body() -> None:
        threads.lower_this_thread()
        out["comm"] = comm(threading.get_native_id())

    t = threading.Thread(target=body, name="cosyserve-flow-scheduler-long")
    t.start()
    t.join()
    assert out["comm"] == "flow-scheduler-"  # 15 bytes: what Linux keeps
    assert comm(threading.get_native_id()) != out["comm"]  # the caller's own name untouched


def test_the_pool_slot_threads_carry_their_names_in_the_kernel(offset):
    async def main() -> list[str]:
        pool = EnginePool(lambda i: FakeEngine(FakeBehaviour(), name=f"fake-{i}"), configs.pool(workers=2))
        await pool.start()
        try:
            return sorted(comm(t.native_id) for t in threading.enumerate() if t.name.startswith("cosyserve-slot-"))
        finally:
            await pool.close()

    assert run(main()) == ["slot-0", "slot-1"]
