"""Admission: owned tickets (moved once, released once) and the permit coming back on every path."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.engines.base import EngineFailure, SynthesisRequest
from app.engines.fake import FakeBehaviour, FakeEngine
from app.serving import (
    DeadlineExceeded,
    Draining,
    EnginePool,
    Overloaded,
    PermitError,
    QueueTimeout,
    Ticket,
)
from app.serving.admission import Admission, interactive
from app.serving.admission.limit import AdaptiveLimit
from app.serving.errors import ClientGone
from app.serving.observer import NullObserver
from app.serving.plan import SpeechFields
from app.serving.speech import SpeechService
from app.text.stream import TextStream
from tests.support import configs
from tests.support.pool import admitted_run, assert_released, synthesize
from tests.support.waiting import await_until, run


def req(rid: str = "r") -> SynthesisRequest:
    return SynthesisRequest(text="hello", mode="sft", speaker="fake_female", request_id=rid)


async def started(b: FakeBehaviour, **cfg) -> EnginePool:
    pool = EnginePool(lambda i: FakeEngine(b), configs.pool(**{"workers": 1, "max_queue": 2, **cfg}))
    await pool.start()
    return pool


# -- the ticket itself -----------------------------------------------------------------------------
def test_admit_counts_and_refuses_at_capacity() -> None:
    async def main():
        adm = Admission(workers=1, max_queue=1, observer=NullObserver())
        a, b = adm.admit(), adm.admit()
        assert (adm.in_flight, adm.queued, adm.admitted) == (2, 2, 2)
        with pytest.raises(Overloaded):
            adm.admit()
        assert adm.rejected == {"queue_full": 1}
        a.started()  # got a slot: no longer queued, still in flight
        assert (adm.in_flight, adm.queued) == (2, 1)
        a.release()
        b.release()  # released while queued: leaves the queue too
        assert (adm.in_flight, adm.queued, adm.misuses) == (0, 0, 0)
        assert await adm.wait_idle(0) is True

    run(main())


def test_a_ticket_moves_once_and_is_released_once() -> None:
    adm = Admission(workers=1, max_queue=0, observer=NullObserver())
    edge = adm.admit()
    service = edge.take()  # the permit moves on; the edge's handle is empty
    assert not edge.held and service.held
    edge.release()  # dropping an empty handle: nothing happens
    assert adm.in_flight == 1 and adm.misuses == 0
    with pytest.raises(PermitError):
        edge.take()  # moving a moved handle is a bug
    job = service.take()
    job.release()
    assert adm.in_flight == 0
    with pytest.raises(PermitError):
        job.release()  # a double release is a bug: refused and counted, never hidden
    with pytest.raises(PermitError):
        job.started()
    assert adm.in_flight == 0 and adm.misuses == 3


# -- every path gives the permit back exactly once ---------------------------------------------------
def test_released_once_on_success_and_on_engine_error() -> None:
    async def main():
        b = FakeBehaviour()
        pool = await started(b)
        try:
            async with await synthesize(pool, req("ok")) as job:
                assert len([c async for c in job]) == 3
            assert_released(pool)
            b.fail_at_chunk = 1
            with pytest.raises(EngineFailure):
                async with await synthesize(pool, req("fails")) as job:
                    async for _ in job:
                        pass
            assert_released(pool)
            assert pool.stats()["admitted"] == 2
        finally:
            await pool.close()

    run(main())


def test_released_once_on_queue_timeout_and_on_cancel_while_queued() -> None:
    async def main():
        b = FakeBehaviour(gate=threading.Event())
        pool = await started(b, queue_timeout_s=0.05)
        try:
            holder = await synthesize(pool, req("holder"))
            with pytest.raises(QueueTimeout):
                await synthesize(pool, req("times-out"))
            waiter = asyncio.create_task(synthesize(pool, req("cancelled")))
            await await_until(lambda: pool.stats()["queued"] == 1)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert pool.stats()["in_flight"] == 1  # only the holder's permit is out
            b.gate.set()
            await holder.aclose()
            assert_released(pool)
            assert b.started == ["holder"]
        finally:
            b.gate.set()
            await pool.close()

    run(main())


def test_released_once_on_the_deadline() -> None:
    async def main():
        b = FakeBehaviour(gate=threading.Event())
        pool = await started(b, request_timeout_s=0.05)
        try:
            async with await synthesize(pool, req("slow")) as job:
                with pytest.raises(DeadlineExceeded):
                    await job.first_chunk()
            assert job.outcome == "timeout"
            assert_released(pool)
        finally:
            b.gate.set()
            await pool.close()

    run(main())


def test_released_once_when_the_pool_closes() -> None:
    async def main():
        b = FakeBehaviour(gate=threading.Event())
        pool = await started(b)
        running = await synthesize(pool, req("running"))
        queued = asyncio.create_task(synthesize(pool, req("queued")))
        await await_until(lambda: pool.stats()["queued"] == 1)
        await pool.close()
        with pytest.raises(Draining):
            await queued
        with pytest.raises(Draining):
            await running.first_chunk()
        await running.aclose()
        assert_released(pool)

    run(main())


def test_released_once_when_the_service_is_cancelled_before_its_task_took_the_ticket() -> None:
    async def main():
        b = FakeBehaviour()
        pool = await started(b)
        service = SpeechService(pool, configs.speech_limits())
        try:
            plan, out = service.plan(SpeechFields(text="hi")), service.output("wav", stream=False)
            outer = asyncio.create_task(admitted_run(service, plan, out))
            await asyncio.sleep(0)  # one step: admitted, its inner task scheduled but not yet run
            assert pool.stats()["in_flight"] == 1
            outer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await outer
            await await_until(lambda: pool.stats()["in_flight"] == 0)
            assert_released(pool)
            assert b.started == []  # never reached a slot
        finally:
            await pool.close()

    run(main())


def test_released_once_when_the_client_leaves_while_queued_or_running() -> None:
    async def main():
        b = FakeBehaviour(gate=threading.Event())
        pool = await started(b)
        service = SpeechService(pool, configs.speech_limits())
        try:
            out = service.output("wav", stream=False)
            held = asyncio.create_task(admitted_run(service, service.plan(SpeechFields(text="a"), "held"), out))
            await await_until(lambda: b.started == ["held"])
            gone = asyncio.Event()
            leaver = asyncio.create_task(admitted_run(service, service.plan(SpeechFields(text="b"), "leaver"), out, gone=gone))
            await await_until(lambda: pool.stats()["queued"] == 1)
            gone.set()
            with pytest.raises(ClientGone):
                await leaver
            assert pool.stats()["in_flight"] == 1
            gone2 = asyncio.Event()
            b.gate.set()
            await held
            b.chunks, b.chunk_delay_s = 50, 0.02
            running = asyncio.create_task(admitted_run(service, service.plan(SpeechFields(text="c"), "runs"), out, gone=gone2))
            await await_until(lambda: "runs" in b.started)
            gone2.set()
            with pytest.raises(ClientGone):
                await running
            assert_released(pool)
        finally:
            b.gate.set()
            await pool.close()

    run(main())


# -- adaptive admission ------------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def adaptive(limit: int, ceiling: int = 8, budget_s: float = 10.0) -> tuple[Admission, FakeClock]:
    clock = FakeClock()
    lim = AdaptiveLimit(configs.adaptive(ceiling=ceiling, initial=limit, budget_s=budget_s), clock=clock)
    return Admission(workers=ceiling, max_queue=0, observer=NullObserver(), limiter=lim, clock=clock), clock


def teach_sizes(adm: Admission, n: int, chars: int = 10) -> None:
    """``n`` requests of ``chars`` characters, admitted and released: the average size the gate knows."""
    for _ in range(n):
        t = adm.admit()
        t.charge(chars)
        t.release()


def lane_ticket(pool: EnginePool) -> Ticket:
    """A ticket of the pool's gate charged 4,000 characters: a long job in a lane (the gate knows 10 as average)."""
    ticket = pool.gate.admit_now()
    ticket.charge(4000)
    assert ticket.in_lane
    return ticket


def test_adaptive_refuses_past_the_limit_as_over_budget_with_retry_after_from_the_predicted_wait() -> None:
    adm, _ = adaptive(limit=2)
    a, b = adm.admit(), adm.admit()
    assert adm.predicted_wait_s() > 0
    with pytest.raises(Overloaded) as refused:
        adm.admit()
    assert adm.rejected == {"over_budget": 1}
    # no latency seen yet: the budget (10 s) stands in for it; one of 2 must end: 10 / 2 = 5 s
    assert refused.value.retry_after_s == 5.0 == adm.retry_after_s()
    adm.observe_latency(a, 3.0)  # an average request now takes 3 s
    assert adm.retry_after_s() == 3.0  # no rate measured at 2 running yet: one at a time, 3 s
    a.release()
    assert adm.predicted_wait_s() == 0.0
    c = adm.admit()  # room again
    snap = adm.snapshot()
    assert (snap["mode"], snap["limit"], snap["ceiling"], snap["load"]) == ("adaptive", 2, 8, 2.0)
    b.release()
    c.release()
    assert adm.load == 0.0 and adm.in_flight == 0


def test_the_hard_ceiling_still_refuses_as_queue_full() -> None:
    adm, _ = adaptive(limit=8, ceiling=2)
    adm.admit(), adm.admit()
    with pytest.raises(Overloaded):
        adm.admit()
    assert adm.rejected == {"queue_full": 1}


def test_a_long_request_takes_more_of_the_limit_once_charged_and_is_read_per_unit_of_size() -> None:
    adm, clock = adaptive(limit=4)
    short = adm.admit()
    short.charge(100)  # the first size sets the average: weight 1
    long = adm.admit()
    long.charge(300)  # average 100 -> 120: weight 2.5
    assert long.weight == pytest.approx(2.5) and adm.load == pytest.approx(3.5)
    with pytest.raises(Overloaded):
        adm.admit()  # one more average request would make 4.5 > 4
    clock.t += 1
    adm.observe_latency(long, 5.0)
    assert adm.limiter.average_s == pytest.approx(2.0)  # 5 s for 2.5 average requests
    long.release()
    short.release()
    assert adm.load == 0.0


def test_a_long_job_rides_in_a_lane_and_short_requests_keep_the_limits_places() -> None:
    adm, clock = adaptive(limit=2)
    short = adm.admit()
    short.charge(10)  # the average size: 10 characters
    long = adm.admit()
    long.charge(4000)  # average 10 -> 409: weight 9.8, and 4,000 characters: a long job
    assert long.in_lane and long.weight == pytest.approx(4000 / 409)
    assert adm.gate_load == pytest.approx(1.0) and adm.load == pytest.approx(1 + 4000 / 409)
    assert (adm.lanes, adm.slot_cap) == (1, 3)  # one slot beyond the limit's two
    other = adm.admit()  # the gate holds one average request: a second fits the limit of 2
    with pytest.raises(Overloaded):
        adm.admit()
    long.started()
    clock.t += 1
    adm.observe_latency(long, 30.0)  # it ran beside the limit's places: no sample
    assert adm.limiter.average_s is None
    long.release()
    assert (adm.lanes, adm.lane_load, adm.slot_cap) == (0, 0.0, 2)
    assert adm.snapshot()["lanes"] == 0
    short.release()
    other.release()
    assert adm.load == 0.0


def test_lanes_are_bounded_by_the_limit_and_a_long_job_beyond_them_counts_by_its_weight() -> None:
    adm, _ = adaptive(limit=1)
    teach_sizes(adm, 2)  # sizes: an average of 10 characters
    lane = adm.admit()
    lane.charge(4000)  # into the one lane: the gate is empty again
    gated = adm.admit()
    gated.charge(4000)  # no lane left: it stays in the gate
    assert lane.in_lane and not gated.in_lane and adm.lanes == 1
    assert adm.gate_load == pytest.approx(gated.weight) and gated.weight >= 4
    with pytest.raises(Overloaded):
        adm.admit()  # the gate is full of the second long job, as before lanes
    lane.release()
    gated.release()


def test_a_request_several_times_the_average_but_short_stays_in_the_gate() -> None:
    adm, _ = adaptive(limit=4)
    for _ in range(3):
        t = adm.admit()
        t.charge(10)
        t.release()
    medium = adm.admit()
    medium.charge(200)  # weight 200 / 29 = 6.9, yet a sentence or two: seconds of work, no lane
    assert medium.weight >= 4 and not medium.in_lane and adm.lanes == 0
    medium.release()


def test_an_open_ended_job_rides_in_a_lane_and_is_no_sample() -> None:
    adm, clock = adaptive(limit=1)
    utterance = adm.admit()
    utterance.open_ended()  # a WebSocket utterance: text arriving over time
    assert utterance.in_lane and adm.gate_load == 0.0 and adm.slot_cap == 2
    short = adm.admit()  # the limit's one place is free
    short.started()
    utterance.started()
    assert adm.lanes_running == 1
    clock.t += 1
    adm.observe_latency(utterance, 60.0)
    assert adm.limiter.average_s is None
    utterance.release()
    short.release()
    assert (adm.lanes, adm.lanes_running, adm.load) == (0, 0, 0.0)


def test_a_lane_job_pauses_only_while_short_requests_are_in_flight_and_it_is_ahead_of_real_time() -> None:
    adm, _ = adaptive(limit=2)
    teach_sizes(adm, 2)  # sizes: an average of 10 characters
    long = adm.admit()
    long.charge(4000)
    long.started()
    assert long.in_lane and long.pause_s(0.2, 30.0) == 0.0  # alone: full speed
    short = adm.admit()  # queued: in flight, outside the lanes
    share, lead = interactive.LANE_SHARE, interactive.LANE_LEAD_S
    assert long.pause_s(0.2, 30.0) == pytest.approx(0.2 * (1 - share) / share)  # works ``share`` of the time
    assert long.pause_s(60.0, 30.0) == interactive.LANE_PAUSE_MAX_S  # one long piece: a bounded pause
    assert long.pause_s(0.2, lead + 0.1) == pytest.approx(0.1)  # never below the lead a listener has
    assert long.pause_s(0.2, lead) == 0.0 == long.pause_s(0.2, -5.0)  # behind real time: full speed
    assert short.pause_s(0.2, 30.0) == 0.0  # a short request never pauses
    short.started()
    assert long.pause_s(0.2, 30.0) > 0
    short.release()
    assert long.pause_s(0.2, 30.0) == 0.0  # the short one is done: full speed again
    long.release()


def test_a_short_request_runs_beside_a_long_job_at_limit_one() -> None:
    """Through the pool: the long job's lane is a slot beyond the limit, so the short one is not queued
    behind it (without the lane it would wait for that slot until its queue timeout)."""

    async def main():
        pool = await started(FakeBehaviour(), workers=2, max_queue=2, admission="adaptive",
                             admission_budget_s=5.0, queue_timeout_s=2.0)
        pool.gate.start_at(1)
        try:
            adm = pool.gate.admission
            teach_sizes(adm, 3)  # sizes: an average of 10 characters
            long_ticket = lane_ticket(pool)
            assert adm.slot_cap == 2
            text = TextStream()  # the long job holds its slot until its text comes
            long_job = await pool.run(long_ticket, SynthesisRequest(text_stream=text, mode="sft",
                                                                    speaker="fake_female", request_id="long"))
            async with await synthesize(pool, req("short")) as short_job:
                assert len([c async for c in short_job]) == 3
            assert short_job.queue_wait_s < 1.0
            text.put("At last.")
            text.end()
            async with long_job:
                assert len([c async for c in long_job]) == 3
            assert_released(pool)
            assert adm.lanes == 0 and adm.slot_cap == 1
        finally:
            await pool.close()

    run(main())


def test_a_long_job_yields_its_time_to_a_short_request_and_its_deadline_follows() -> None:
    """Through the pool: a long job in a lane pauses after each piece while a short request is in flight
    (here a short ticket admitted and held: in flight, never run), not before it came nor after it left."""

    async def main():
        b = FakeBehaviour(chunks=40, chunk_s=1.0, chunk_delay_s=0.02)  # far ahead of real time: may pause
        pool = await started(b, workers=2, max_queue=2, admission="adaptive", admission_budget_s=5.0,
                             request_timeout_s=30.0)
        pool.gate.start_at(2)
        try:
            adm = pool.gate.admission
            teach_sizes(adm, 3)  # sizes: an average of 10 characters
            async with await pool.run(lane_ticket(pool), req("long")) as alone:
                assert len([c async for c in alone]) == 40
            assert alone.paused_s == 0.0  # nobody else: full speed

            long_job = await pool.run(lane_ticket(pool), req("long-2"))

            async def read() -> int:
                async with long_job:
                    return len([c async for c in long_job])

            reader = asyncio.create_task(read())
            short_ticket = pool.gate.admit_now()  # in flight (queued for a slot or running) until released
            await asyncio.sleep(0.4)
            paused_beside = long_job.paused_s
            assert paused_beside > 0.15  # it worked ~0.02 s a piece and paused ~3x that
            assert long_job.deadline_s == pytest.approx(30.0 + long_job.paused_s, abs=0.05)
            short_ticket.release()
            assert await reader == 40
            assert long_job.paused_s < paused_beside + 0.1  # the short one left: full speed again
            assert_released(pool)
            assert adm.snapshot()["lane_paused_s"] == pytest.approx(long_job.paused_s, abs=0.001)
        finally:
            await pool.close()

    run(main())


def test_only_lone_requests_teach_the_unloaded_latency_and_excluded_ones_teach_nothing() -> None:
    adm, _ = adaptive(limit=4)
    first = adm.admit()
    first.started()  # started alone ...
    other = adm.admit()
    other.started()  # ... but not alone for long
    adm.observe_latency(first, 2.0)
    assert adm.limiter.unloaded_s == 2.0  # nobody ran alone yet: the lowest latency stands in
    first.release()
    other.release()
    lone = adm.admit()
    waiting = adm.admit()  # admitted beside it, but it only waits: the first still runs alone
    lone.started()
    adm.observe_latency(lone, 3.0)
    lone.release()
    waiting.release()
    assert adm.limiter.unloaded_s == 3.0  # the lone request's latency, not the lowest seen
    average = adm.limiter.average_s
    quiet = adm.admit()
    quiet.started()
    quiet.exclude()  # e.g. text arriving over time: its latency is the client's pace
    adm.observe_latency(quiet, 50.0)
    quiet.release()
    assert adm.limiter.unloaded_s == 3.0 and adm.limiter.average_s == average


def test_fixed_mode_keeps_the_capacity_and_ignores_sizes() -> None:
    adm = Admission(workers=1, max_queue=1, observer=NullObserver())
    a = adm.admit()
    a.charge(5000)
    b = adm.admit()  # a fixed gate counts requests, whatever their size
    snap = adm.snapshot()
    assert (snap["mode"], snap["limit"], snap["target_s"]) == ("fixed", 2, None)
    assert adm.predicted_wait_s() > 0  # both places taken: a newcomer would wait
    a.release()
    b.release()


def test_an_adaptive_pool_feeds_the_controller_and_reports_it() -> None:
    async def main():
        b = FakeBehaviour()
        pool = await started(b, workers=2, max_queue=0, admission="adaptive", admission_budget_s=5.0)
        try:
            async with await synthesize(pool, req("a")) as job:
                assert len([c async for c in job]) == 3
            assert_released(pool)
            adm = pool.stats()["admission"]
            assert adm["mode"] == "adaptive" and adm["ceiling"] == 2 and adm["target_s"] == 5.0
            assert adm["average_s"] is not None and adm["unloaded_s"] is not None  # one lone sample
        finally:
            await pool.close()

    run(main())


def test_adaptive_runs_only_limit_requests_and_lets_the_next_wait_within_the_budget() -> None:
    async def main():
        b = FakeBehaviour()
        pool = await started(b, workers=3, max_queue=0, admission="adaptive", admission_budget_s=5.0)
        try:
            async with await synthesize(pool, req("warm")) as job:  # an average request: a few ms
                [c async for c in job]
            pool.gate.start_at(1)
            b.gate = threading.Event()
            first = asyncio.create_task(synthesize(pool, req("first")))
            await await_until(lambda: "first" in b.started)
            second = asyncio.create_task(synthesize(pool, req("second")))  # admitted: it may wait its turn
            await await_until(lambda: pool.stats()["queued"] == 1)
            assert "second" not in b.started  # two idle slots, but the limit runs one request at a time
            assert pool.gate.admission.predicted_wait_s() > 0
            third = pool.gate.admit_now()  # the budget still has room for another short wait ...
            with pytest.raises(Overloaded):
                pool.gate.admit_now()  # ... but all 3 workers are taken (the ceiling)
            third.release()
            b.gate.set()
            for task in (first, second):
                async with await task as job:
                    assert len([c async for c in job]) == 3
            assert_released(pool)
            assert pool.stats()["rejected"] == {"queue_full": 1}
        finally:
            await pool.close()

    run(main())


@pytest.mark.parametrize("limits", [
    {"admission_budget_s": 0.06},  # waiting ~50 ms, then ~50 ms of service: past the 60 ms budget
    {"admission_budget_s": 60.0, "queue_timeout_s": 0.02},  # a ~50 ms wait: within 60 s, past the 20 ms timeout
], ids=["past-the-budget", "past-the-queue-timeout"])
def test_adaptive_refuses_at_once_a_wait_past_the_budget_or_the_queue_timeout(limits) -> None:
    async def main():
        b = FakeBehaviour(first_chunk_delay_s=0.05)  # ~50 ms per request
        pool = await started(b, workers=3, max_queue=0, admission="adaptive", **limits)
        try:
            async with await synthesize(pool, req("warm")) as job:
                [c async for c in job]
            pool.gate.start_at(1)
            held = pool.gate.admit_now()
            with pytest.raises(Overloaded) as refused:
                pool.gate.admit_now()  # at once (not a 503 queue_timeout after the wait)
            assert refused.value.retry_after_s >= 1
            assert pool.stats()["rejected"] == {"over_budget": 1}
            held.release()
        finally:
            await pool.close()

    run(main())


def test_a_request_beside_bulk_work_never_teaches_the_unloaded_latency() -> None:
    class Bulk:  # the bulk class's account (app/serving/admission/bulk.py): counted apart, but it computes
        running = 0
        starts = 0

    adm, _ = adaptive(limit=4)
    adm.others = bulk = Bulk()
    lone = adm.admit()
    lone.started()
    adm.observe_latency(lone, 3.0)
    lone.release()
    assert adm.limiter.unloaded_s == 3.0
    bulk.running, bulk.starts = 1, 1  # a bulk request runs when this one starts
    beside = adm.admit()
    beside.started()
    adm.observe_latency(beside, 9.0)
    beside.release()
    bulk.running = 0
    late = adm.admit()
    late.started()
    bulk.running, bulk.starts = 1, 2  # a bulk request starts while it runs
    adm.observe_latency(late, 8.0)
    late.release()
    assert adm.limiter.unloaded_s == 3.0  # neither ran alone
