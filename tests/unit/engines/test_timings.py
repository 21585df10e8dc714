"""StageTimings: per-request seconds per stage, bound to the thread that runs the request's code."""

from __future__ import annotations

import threading
import time

from app.engines.timings import STAGES, StageTimings, bound, bound_iter, current, timed


def test_adds_accumulate_in_stage_order_and_render_for_the_log():
    t = StageTimings()
    assert t.snapshot() == {} and t.text() == "-"
    t.add("flow", 0.25)
    t.add("frontend", 0.002)
    t.add("flow", 0.5)
    t.add("hift", -1.0)  # never negative
    assert list(t.snapshot()) == ["frontend", "flow", "hift"]
    assert t.snapshot()["flow"] == 0.75 and t.snapshot()["hift"] == 0.0
    assert t.text() == "frontend=2ms,flow=750ms,hift=0ms"
    assert set(STAGES) == {"frontend", "llm", "flow", "hift", "encode"}


def test_timed_functions_add_to_the_calling_threads_timings_only():
    sleep = timed(lambda s: time.sleep(s) or s, "flow")
    mine, theirs = StageTimings(), StageTimings()
    assert sleep(0.0) == 0.0  # nothing bound: runs, records nothing

    def other() -> None:
        with bound(theirs):
            sleep(0.05)

    with bound(mine):
        worker = threading.Thread(target=other)
        worker.start()
        sleep(0.02)
        worker.join()
        assert current() is mine
    assert current() is None
    assert 0.02 <= mine.snapshot()["flow"] < 0.05
    assert theirs.snapshot()["flow"] >= 0.05


def test_bound_iter_binds_only_while_the_generator_runs_and_closes_it():
    t = StageTimings()
    work = timed(time.sleep, "hift")
    closed = []

    def gen():
        try:
            for _ in range(3):
                work(0.01)
                yield current()
        finally:
            closed.append(current())

    it = bound_iter(gen(), t)
    assert next(it) is t
    assert current() is None  # the consumer's code is not timed
    time.sleep(0.05)
    assert next(it) is t
    it.close()
    assert closed == [t]
    assert 0.02 <= t.snapshot()["hift"] < 0.05  # two calls, not the consumer's sleep
