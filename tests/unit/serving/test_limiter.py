"""The adaptive admission limit (app/serving/admission/limit/), driven by a fake clock and a synthetic server.

The synthetic server: ``clients`` closed-loop clients, of which ``min(clients, limit)`` are
admitted; with ``n`` in flight a request takes ``latency(n)`` seconds and requests finish at
``n / latency(n)`` per second. By default a saturating queue: ``max(unloaded, n / capacity)``
(Little's law once saturated); ``slope`` makes latency grow by that share of the unloaded
latency per extra request instead (throughput still rising); ``table`` gives it outright.
``noise`` spreads each request's latency uniformly by that share either side (seeded, like a
busy CPU). Everything is deterministic.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from app.serving.admission.limit import AdaptiveLimit
from app.serving.admission.limit.waiting import WaitingRoom
from tests.support import configs
from tests.support.limiter import Clock, changes


class Server:
    """A closed loop against the limiter; ``run`` advances the fake clock and feeds latency samples."""

    def __init__(self, limiter: AdaptiveLimit, clock: Clock, *, unloaded_s: float = 1.0, capacity: float = 1.25,
                 slope: float | None = None, table: dict[int, float] | None = None, dt: float = 0.05,
                 noise: float = 0.0, seed: int = 0, drift: float = 0.0, drift_s: float = 20.0,
                 trend: float = 0.0) -> None:
        self.lim, self.clock = limiter, clock
        self.noise, self._rng = noise, random.Random(seed)
        self.drift, self.drift_s, self._speed = drift, drift_s, 0.0  # log slowdown: a mean-reverting walk
        self.trend = trend  # ... and a steady one, per minute
        self.unloaded_s, self.capacity, self.dt = unloaded_s, capacity, dt
        self.slope, self.table = slope, table
        self._due = 0.0
        self.history: list[tuple[float, int]] = []  # (time, limit) after each tick

    def latency(self, n: int) -> float:
        return self.base_latency(n) * math.exp(self._speed + self.trend * self.clock.t / 60.0)

    def base_latency(self, n: int) -> float:
        if self.table is not None:
            return self.table[min(n, max(self.table))]
        if self.slope is not None:
            return self.unloaded_s * (1 + self.slope * (n - 1))
        return max(self.unloaded_s, n / self.capacity)

    def run(self, seconds: float, clients: int) -> None:
        end = self.clock.t + seconds
        while self.clock.t < end - 1e-9:
            if self.drift:  # a shared host's speed wanders (sd ``drift``, reverting over ``drift_s``)
                a = self.dt / self.drift_s
                self._speed += -a * self._speed + self.drift * math.sqrt(2 * a) * self._rng.gauss(0.0, 1.0)
            n = min(clients, self.lim.value)
            self.lim.note_load(n, running=n)
            if clients > self.lim.value:
                self.lim.note_refused()
            s = self.latency(n)
            self._due += n / s * self.dt
            while self._due >= 1.0:
                self._due -= 1.0
                sample = s * (1.0 + self.noise * self._rng.uniform(-1.0, 1.0))
                self.lim.observe(sample, admitted_at=self.clock.t - s, alone=(n == 1 and clients == 1))
            self.clock.t += self.dt
            self.history.append((self.clock.t, self.lim.value))

    def changes_after(self, t: float) -> list[tuple[float, int]]:
        """(time, new limit) of every change after ``t``."""
        return changes(self.history, t)


def make(initial: float, ceiling: int = 16, server: dict | None = None, **kw) -> tuple[AdaptiveLimit, Server]:
    kw.setdefault("level_samples", 1)  # noise-free: one window tells a level (the noisy tests pool them)
    clock = Clock()
    lim = AdaptiveLimit(configs.adaptive(ceiling=ceiling, initial=initial, **kw), clock=clock)
    return lim, Server(lim, clock, **(server or {}))


def test_it_lowers_the_limit_when_latency_rises_where_littles_law_says_then_finds_the_knee():
    lim, srv = make(initial=16, tolerance=4.0)  # unloaded 1 s: target 4 s; capacity 1.25/s -> 5 in flight
    srv.run(10, clients=1)  # lone requests: the unloaded latency
    assert lim.unloaded_s == pytest.approx(1.0) and lim.target_s == pytest.approx(4.0)
    assert lim.value == 16  # nothing pressed it yet
    t0 = srv.clock.t
    srv.run(60, clients=32)
    changes = srv.changes_after(t0)
    assert [v for _, v in changes[:2]] == [8, 5]  # over budget: at most halved, then onto 1.25/s x 4 s
    # saturated from 2 in flight: 3 to 5 only add latency, so it probes its way down to the knee
    assert lim.value == 2 and srv.changes_after(t0 + 35) == []


def test_it_raises_the_limit_when_there_is_headroom_and_demand():
    # latency 1, 1.25, 1.5, ... s: throughput keeps rising (1, 1.6, 2, 2.3, 2.5/s ...); the 2 s budget binds at 5
    lim, srv = make(initial=1, budget_s=2.0, server={"slope": 0.25})
    srv.run(40, clients=32)
    assert lim.value == 5
    assert srv.changes_after(srv.clock.t - 15) == []


def test_it_does_not_grow_when_the_limit_is_not_reached():
    lim, srv = make(initial=3, budget_s=4.0)
    srv.run(30, clients=2)  # latency 1.6 s, far below the budget, but only 2 of 3 places are used
    assert lim.value == 3 and lim.steps == 0


def test_never_above_the_ceiling():
    lim, srv = make(initial=2, ceiling=6, budget_s=100.0, server={"slope": 0.05})
    srv.run(60, clients=64)
    assert lim.value == 6
    assert max(v for _, v in srv.history) == 6


def test_never_below_one():
    lim, srv = make(initial=8, budget_s=0.01)  # no request can ever meet this budget
    srv.run(60, clients=64)
    assert lim.value == 1 and lim.limit >= 1.0
    assert min(v for _, v in srv.history) == 1


def test_it_settles_after_a_load_step_at_the_knee_within_the_budget():
    # latency 1, 1.25, 1.5 ... s, throughput 1, 1.6, 2 ... 2.8/s at 7, 2.91/s at 8 (+3.9 %: under min_gain, 5 %)
    lim, srv = make(initial=4, tolerance=4.0, server={"slope": 0.25})
    srv.run(10, clients=1)  # learn the unloaded latency
    srv.run(40, clients=3)  # below the limit: it does not move
    assert lim.value == 4
    t0 = srv.clock.t
    srv.run(40, clients=24)  # a step past what it admits: up by the headroom, probes one by one, back to the knee
    assert [v for _, v in srv.changes_after(t0)] == [6, 7, 8, 7]
    assert lim.value == 7 and srv.changes_after(t0 + 25) == []
    t1 = srv.clock.t
    srv.run(30, clients=3)  # and back: below the limit again, nothing moves
    assert srv.changes_after(t1) == [] and lim.value == 7


def test_samples_of_requests_admitted_before_a_change_do_not_move_it_again():
    clock = Clock()
    lim = AdaptiveLimit(configs.adaptive(ceiling=16, initial=16, budget_s=1.0), clock=clock)
    for _ in range(3):
        lim.observe(8.0, admitted_at=0.0)
    clock.t = 1.0
    lim.observe(8.0, admitted_at=0.0)  # a step: 16 x max(1/8, 0.5)
    assert lim.value == 8 and lim.steps == 1
    for i in range(10):  # still the old, crowded requests: ignored for the next step
        clock.t = 2.0 + i
        lim.observe(8.0, admitted_at=0.5)
    assert lim.value == 8 and lim.steps == 1
    for _ in range(3):  # requests admitted after the change count again
        clock.t += 1.0
        lim.observe(8.0, admitted_at=1.5)
    assert lim.value == 4 and lim.steps == 2


def test_the_unloaded_latency_is_the_median_of_lone_requests_else_the_lowest_seen():
    lim = AdaptiveLimit(configs.adaptive(ceiling=8, initial=8), clock=Clock())
    assert lim.unloaded_s is None and lim.target_s is None
    lim.observe(3.0, admitted_at=0.0)
    lim.observe(2.0, admitted_at=0.0)
    assert lim.unloaded_s == 2.0  # nobody ran alone yet: the lowest latency stands in
    for s in (1.0, 1.2, 5.0):
        lim.observe(s, admitted_at=0.0, alone=True)
    assert lim.unloaded_s == 1.2 and lim.target_s == pytest.approx(3.0)  # the default tolerance: 2.5


def test_the_waiting_room_admits_while_the_predicted_latency_is_within_the_budget():
    clock = Clock()
    lim = AdaptiveLimit(configs.adaptive(ceiling=16, initial=8, budget_s=2.1, level_samples=3), clock=clock)
    assert lim.allows(7.0) and lim.predicted_wait_s(7.0) == 0.0  # runs at once
    assert not lim.allows(8.0)  # nothing measured yet: no waiting room
    assert lim.allows(0.0, weight=20.0)  # an empty server takes even a very long request
    lim.note_load(8.0)  # the limit was reached ...
    clock.t = 2.0
    for _ in range(3):
        lim.observe(2.0, admitted_at=1.0)  # ... and 8 running took 2 s each: 4 requests a second
    assert lim.value == 7  # within the budget, the level below unknown: it probes 7
    assert lim.rate() == pytest.approx(3.5)  # 4/s at 8 scaled to 7: each runs no slower with fewer
    assert lim.predicted_wait_s(7.0) == pytest.approx(1 / 3.5)  # one must end
    assert lim.allows(7.0)  # 0.29 s + 7 / 3.5 = 2 s of service <= 2.1 s (+10 %)
    assert lim.predicted_wait_s(8.0) == pytest.approx(2 / 3.5) and not lim.allows(8.0)  # 2.57 s
    assert lim.predicted_wait_s(6.5, weight=2.0) == pytest.approx(2 / 3.5)  # a double-size request needs 2 places


def test_with_the_automatic_budget_a_request_may_always_wait_one_round_of_the_running_ones():
    # two running take 2 s each (1/s); the unloaded latency is 1 s, so the automatic target is 2.5 s, which a
    # wait of 1 s plus 2 s of service misses: one round of waiting (a queue as deep as the running set) is
    # what keeps the places busy between Poisson arrivals (docs/concurrency.md), so it is allowed anyway
    def admits(load: float, **kw) -> bool:
        return WaitingRoom(**kw).admits(load, 1.0, limit=2, rate=1.0, target=2.5)

    assert admits(2.0) and admits(3.0)  # waits of 1 s and 2 s: within one round (2 s)
    assert not admits(4.0)  # a 3 s wait: past the round and the budget
    assert not admits(2.0, promise=True)  # an operator's budget is a promise: 1 s + 2 s > 2.5 s
    assert not admits(3.0, max_wait_s=1.5)  # nor past the queue timeout


def test_no_request_waits_past_max_wait_even_within_the_budget():
    def measured(max_wait_s: float) -> AdaptiveLimit:
        clock = Clock()
        lim = AdaptiveLimit(configs.adaptive(ceiling=16, initial=8, budget_s=2.1, max_wait_s=max_wait_s,
                                         level_samples=3), clock=clock)
        lim.note_load(8.0)
        clock.t = 2.0
        for _ in range(3):
            lim.observe(2.0, admitted_at=1.0)  # 8 running, 2 s each: 4/s; it probes 7 (3.5/s)
        assert lim.value == 7 and lim.predicted_wait_s(7.0) == pytest.approx(1 / 3.5)
        return lim

    assert measured(max_wait_s=0.4).allows(7.0)  # a 0.29 s wait + 2 s of service: within the 2.1 s budget
    assert not measured(max_wait_s=0.2).allows(7.0)  # the same, but the queue timeout would end the wait first


@pytest.mark.parametrize("pool", [{"workers": 0}, {"admission_budget_s": 0}, {"admission_tolerance": 1.0},
                                  {"queue_timeout_s": 0}])
def test_its_settings_are_validated_where_they_are_declared(pool):
    from pydantic import ValidationError

    from app.settings import PoolSettings

    with pytest.raises(ValidationError):
        PoolSettings(**pool)


def test_the_initial_limit_is_clamped_into_range():
    assert AdaptiveLimit(configs.adaptive(ceiling=4, initial=10)).value == 4
    assert AdaptiveLimit(configs.adaptive(ceiling=4, initial=0)).value == 1


def test_an_optimum_between_two_integers_does_not_make_it_flap():
    lim, srv = make(initial=4, tolerance=2.0)  # target 2 s; 1.25/s x 2 s = 2.5 in flight
    srv.run(10, clients=1)
    t0 = srv.clock.t
    srv.run(100, clients=32)
    assert lim.value == 2 and srv.latency(2) <= lim.target_s < srv.latency(3)
    # 4 -> 2 (Little's law), a probe of 3 (misses the target) and of 1 (finishes less), back to 2; then quiet
    assert [v for _, v in srv.changes_after(t0)] == [2, 3, 2, 1, 2]
    assert srv.changes_after(t0 + 15) == []
    srv.run(230, clients=32)  # past probe_after_s (300 s): its neighbours are checked again, once each
    assert [v for _, v in srv.changes_after(t0 + 100)] == [3, 2, 1, 2] and lim.value == 2


def test_levels_age_by_seconds_of_load_so_the_next_overload_starts_at_the_knee_the_last_one_found():
    lim, srv = make(initial=4, tolerance=2.0)  # as above: the knee is 2; 3 misses the target, 1 finishes less
    srv.run(10, clients=1)
    srv.run(100, clients=32)
    assert lim.value == 2
    srv.run(400, clients=0)  # idle for longer than probe_after_s (300 s): nothing measured ages
    t0 = srv.clock.t
    srv.run(20, clients=32)
    # the levels of the last overload still hold: no probe of 3 and 1 in the first seconds of this one
    # (with levels aging by the clock it went 3, 2, 1, 2 here)
    assert srv.changes_after(t0) == [] and lim.value == 2
    srv.run(300, clients=32)  # 300 s of load since the last probes: its neighbours are checked again, once each
    assert [v for _, v in srv.changes_after(t0)] == [3, 2, 1, 2] and lim.value == 2


def test_it_stops_at_the_knee_more_in_flight_that_finish_no_faster_only_add_latency():
    # saturated from 2 in flight (1.25/s): the 4 s budget would admit 5, but 3 to 5 add nothing but latency
    lim, srv = make(initial=1, budget_s=4.0)
    srv.run(100, clients=32)
    assert lim.value == 2
    assert srv.changes_after(srv.clock.t - 80) == []


def test_it_steps_down_when_fewer_in_flight_finish_more():
    # a GIL-bound CPU model: 2 in flight is fastest (1.43/s), 3 is within the budget but slower (1.30/s)
    table = {1: 1.0, 2: 1.4, 3: 2.3, 4: 3.2, 5: 4.5}
    lim, srv = make(initial=3, tolerance=2.5, server={"table": table})
    srv.run(5, clients=1)
    srv.run(100, clients=32)
    assert lim.value == 2 and srv.latency(3) <= lim.target_s  # not the budget: the throughput
    assert srv.changes_after(srv.clock.t - 80) == []


def longest_stay(srv: Server, value: int, after: float) -> float:
    """The longest time the limit stayed at ``value`` after ``after`` (seconds)."""
    longest, since = 0.0, None
    for when, v in srv.history:
        if when <= after:
            continue
        if v == value and since is None:
            since = when
        elif v != value and since is not None:
            longest, since = max(longest, when - since), None
    return longest


def test_on_a_noisy_cpu_pooled_levels_find_and_hold_the_knee_where_single_windows_miss_it():
    # a GIL-bound CPU model (2 in flight is fastest, 3 and 4 finish less) and +-25 % noise per request
    table = {1: 0.16, 2: 0.2, 3: 0.31, 4: 0.42, 5: 0.55, 6: 0.68}
    at_knee: dict[int, list[float]] = {1: [], 24: []}
    for seed in range(1, 17):
        for level_samples in (1, 24):
            lim, srv = make(initial=2, tolerance=2.5, level_samples=level_samples,
                            server={"table": table, "noise": 0.25, "seed": seed})
            srv.run(5, clients=1)  # the unloaded latency
            t0 = srv.clock.t
            srv.run(240, clients=32)
            at = [v for t, v in srv.history if t > t0 + 30]
            at_knee[level_samples].append(at.count(2) / len(at))
            if level_samples == 24:  # settled within 15 s; then one probe of each neighbour per probe_after_s
                assert len(srv.changes_after(t0 + 15)) <= 10 and lim.value == 2
                # a probe of 1 (clearly worse: ~60 % of 2's throughput) is over after clear_samples, not 24
                assert longest_stay(srv, 1, after=t0) <= 3.0
    # pooled, every seed holds the knee; one window of noisy samples now and then reads 3 as the better level.
    # (Before the places had to be 90 % busy for a window to tell a level's throughput, the window that
    # straddled the step from one client to 32, 75 % busy, read as level 2's throughput, ~70 % of it,
    # and kept the limit at 3 or 4 for the whole 240 s in 3 seeds of 16.)
    assert min(at_knee[24]) >= 0.9 and statistics.fmean(at_knee[1]) < statistics.fmean(at_knee[24])


def test_the_stand_in_unloaded_latency_does_not_rise_with_the_load_it_admits():
    # no request ever runs alone: the lowest window median stands in, not a recent (loaded) latency
    lim, srv = make(initial=2, tolerance=2.5, ceiling=16, server={"slope": 0.6})
    srv.run(20, clients=32)
    first = lim.unloaded_s
    srv.run(200, clients=32)
    assert lim.unloaded_s <= first and lim.target_s <= 2.5 * first
    assert lim.value < 16


def test_after_a_step_down_the_new_level_is_measured_once_the_excess_has_finished():
    clock = Clock()
    lim = AdaptiveLimit(configs.adaptive(ceiling=16, initial=8, budget_s=1.0), clock=clock)
    lim.note_load(8.0, running=8)
    for _ in range(3):
        lim.observe(2.0, admitted_at=0.0)
    clock.t = 1.0
    lim.observe(2.0, admitted_at=0.0)  # over budget: 8 -> 4, but 8 are still running
    assert lim.value == 4 and lim.steps == 1
    for i in range(6):  # admitted after the change, while the old 8 still ran: their latency is the old level's
        clock.t = 2.0 + i
        lim.observe(2.0, admitted_at=1.5)
    assert lim.value == 4 and lim.steps == 1
    clock.t = 8.5
    lim.note_load(4.0, running=4)  # the excess has finished
    for _ in range(3):
        clock.t += 1.0
        lim.observe(0.5, admitted_at=9.0)  # the new level's own latency: within the budget
    assert lim.steps == 2 and lim.value == 6  # measured at 4 at last: far within the budget, it grows


def test_a_lightly_loaded_window_is_not_read_as_capacity():
    clock = Clock()
    lim = AdaptiveLimit(configs.adaptive(ceiling=16, initial=4, budget_s=10.0, level_samples=3), clock=clock)
    for i in range(40):  # one request at a time, reaching 4 in flight for an instant each second
        clock.t = i * 0.25
        lim.note_load(4.0 if i % 4 == 0 else 1.0, running=1)
        lim.observe(0.2, admitted_at=clock.t - 0.2)
    # 4 / 0.2 s would read as 20 requests a second; about one ran at a time: 5 a second at most
    assert all(x is None or x <= 6.0 for x in (lim.knee.levels.throughput(k) for k in range(1, 17)))
    assert lim.value == 4 and lim.steps == 0  # far within the budget, but the places were not kept busy: no growth


def test_lone_latencies_older_than_the_horizon_no_longer_set_the_budget():
    # a shared host slows down: the lone requests of long ago no longer say what "unloaded" is
    clock = Clock()
    lim = AdaptiveLimit(configs.adaptive(ceiling=8, initial=2), clock=clock)
    for _ in range(5):
        lim.observe(0.2, admitted_at=clock.t, alone=True)
    assert lim.unloaded_s == pytest.approx(0.2)
    clock.t = 200.0
    for _ in range(3):
        lim.observe(0.4, admitted_at=clock.t, alone=True)  # slower now
    assert lim.unloaded_s == pytest.approx(0.2)  # 5 old, 3 new: still the old median
    clock.t = 300.0  # the old ones fall out of the horizon
    assert lim.unloaded_s == pytest.approx(0.4) and lim.target_s == pytest.approx(1.0)


def host_run(table: dict[int, float], seed: int, seconds: float, host: dict,
             **kw) -> tuple[dict[int, float], float, int]:
    """``seconds`` of 32 clients, +-25 % per request, on a host moving as ``host`` says (Server's drift or
    trend), after 5 s of one client: the share of time at each limit after the first 20 s, the mean
    throughput there, and how many times the limit changed then."""
    lim, srv = make(initial=2, level_samples=24, server={"table": table, "noise": 0.25, "seed": seed, **host}, **kw)
    srv.run(5, clients=1)
    t0 = srv.clock.t
    srv.run(seconds, clients=32)
    at = [v for t, v in srv.history if t > t0 + 20]
    top = max(table)
    return ({k: at.count(k) / len(at) for k in set(at)}, statistics.fmean(min(v, top) / table[min(v, top)] for v in at),
            len(srv.changes_after(t0 + 20)))


def drifting_run(table: dict[int, float], seed: int, **kw) -> tuple[dict[int, float], float]:
    """10 minutes on a host whose speed wanders (sd 15 %, ~20 s): the share of time at each limit after the
    first 20 s, and the mean throughput there."""
    shares, rate, _ = host_run(table, seed, 600, {"drift": 0.15}, **kw)
    return shares, rate


FLAT = {1: 1 / 5.2, 2: 2 / 7.5, 3: 3 / 7.7, 4: 4 / 7.7, 5: 5 / 7.6, 6: 6 / 7.5, 7: 7 / 7.4, 8: 8 / 7.3}  # tiny v2 here


def test_on_a_drifting_host_where_more_running_finish_no_more_the_score_keeps_the_fewest():
    # tiny v2 on this host: 2, 3 and 4 running finish about as many (7.5-7.7/s), 3 and 4 at 1.5-2x the latency
    # (32 seeds: scored 0.95 of the time at 2, throughput alone 0.89; before the paired comparison ~0.92 and
    # ~0.80)
    scored = [drifting_run(FLAT, seed)[0].get(2, 0.0) for seed in range(1, 17)]
    plain = [drifting_run(FLAT, seed, latency_weight=0.0)[0].get(2, 0.0) for seed in range(1, 17)]
    assert statistics.fmean(scored) >= 0.93 and statistics.fmean(scored) >= statistics.fmean(plain) + 0.02


def test_on_a_host_that_slows_levels_are_compared_with_the_windows_next_to_them():
    # the host slows 10 % a minute: unpaired, a level probed a minute ago looks better than the one measured
    # now, whatever they are; paired with the windows next to its probe, it is not
    def run(seed: int, **kw) -> tuple[float, int]:
        shares, _, changes = host_run(FLAT, seed, 300, {"trend": 0.1}, **kw)
        return shares.get(2, 0.0), changes

    paired = [run(seed) for seed in range(1, 9)]
    unpaired = [run(seed, pair_s=0.0) for seed in range(1, 9)]  # measured then (~86 % at 2, 250 changes in all)
    assert statistics.fmean(s for s, _ in paired) >= statistics.fmean(s for s, _ in unpaired) + 0.03
    assert sum(c for _, c in paired) <= 0.5 * sum(c for _, c in unpaired)


def test_on_a_drifting_host_a_level_that_pays_is_still_found():
    # 3 running finish 10 % more than 2 (7.7 vs 7.0/s): the score gives away at most 3 % of throughput for its
    # preference for fewer (simulated: 7.35 against 7.48/s with throughput alone, of 7.8 at best)
    table = {1: 1 / 4.8, 2: 2 / 7.0, 3: 3 / 7.7, 4: 4 / 7.8, 5: 5 / 7.8, 6: 6 / 7.7, 7: 7 / 7.6, 8: 8 / 7.5}
    rates = [drifting_run(table, seed)[1] for seed in range(1, 9)]
    plain = [drifting_run(table, seed, latency_weight=0.0)[1] for seed in range(1, 9)]
    assert statistics.fmean(rates) >= 0.93 * 7.8 and statistics.fmean(rates) >= 0.97 * statistics.fmean(plain)


# full-size v2 on this host, seconds a request (3 running finish 0.265/s, 2 0.215/s, 4 0.267/s at 1.3x 3's latency)
FULL = {1: 7.5, 2: 9.3, 3: 11.3, 4: 15.0, 5: 19.0, 6: 23.0}


def slow_run(scale: float, seed: int) -> tuple[float, int]:
    """20 minutes (in units of FULL's latencies, times ``scale``) of the knee's 3 clients, +-20 % a request,
    after a minute of one: the share of time at 3 after the first 2 minutes, and the changes then."""
    table = {k: v * scale for k, v in FULL.items()}
    lim, srv = make(initial=2, tolerance=2.5, level_samples=24,
                    server={"table": table, "noise": 0.2, "seed": seed, "dt": 0.1 * scale})
    srv.run(60 * scale, clients=1)
    t0 = srv.clock.t
    srv.run(1200 * scale, clients=3)
    at = [v for t, v in srv.history if t > t0 + 120 * scale]
    return at.count(3) / len(at), len(srv.changes_after(t0 + 120 * scale))


def test_the_knee_holds_whatever_a_request_takes_tiny_or_full_size():
    # the same latencies, 40x faster (tiny) and as full size: a level is measured in requests, not seconds.
    # Before, with full-size requests, 8 windows of 3 (or at 2, of 2) requests had to hold 24 busy ones,
    # a level judged clearly worse became unknown again when the best level's rate moved a little, and
    # the neighbours were re-probed every 300 s of load, each probe ~110 s: 25-65 % of the time at 3
    # and 6-15 changes in 8 seeds (the server: limit 2.34 beside a backlog, docs/priority.md#measured)
    for seed in range(1, 9):
        fast, _ = slow_run(0.025, seed)
        slow, moved = slow_run(1.0, seed)
        assert fast >= 0.85 and slow >= 0.85 and moved <= 4
