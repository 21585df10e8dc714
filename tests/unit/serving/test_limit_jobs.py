"""The limits' parts, each alone: FixedLimit, and the adaptive limit's three jobs (app/serving/admission/limit/)."""

from __future__ import annotations

import pytest

from app.serving.admission import Admission
from app.serving.admission.limit import AdaptiveLimit, FixedLimit, Limit
from app.serving.admission.limit.baseline import UNLOADED_HORIZON_S, Baseline
from app.serving.admission.limit.knee import KneeSearch
from app.serving.admission.limit.levels import Levels, Window
from app.serving.admission.limit.service_time import ServiceTimeEstimator
from app.serving.admission.limit.waiting import WaitingRoom
from app.serving.observer import NullObserver
from tests.support import configs
from tests.support.limiter import Clock


# -- the protocol ----------------------------------------------------------------------------------
def test_admission_always_holds_a_limit_and_its_mode_is_the_limits_name() -> None:
    fixed = Admission(workers=2, max_queue=1, observer=NullObserver())
    assert isinstance(fixed.limiter, FixedLimit) and fixed.mode == "fixed" and fixed.limit == 3
    adaptive = AdaptiveLimit(configs.adaptive(ceiling=3, initial=2))
    adm = Admission(workers=2, max_queue=1, observer=NullObserver(), limiter=adaptive)
    assert adm.limiter is adaptive and adm.mode == "adaptive" and adm.limit == 2
    for lim in (fixed.limiter, adaptive):
        limit: Limit = lim  # both satisfy the protocol (checked by type checkers; here, by use)
        assert limit.allows(0.0) and limit.predicted_wait_s(0.0) == 0.0 and limit.retry_after_s(0.2) >= 1


# -- FixedLimit ------------------------------------------------------------------------------------
def test_fixed_counts_requests_and_predicts_the_wait_behind_busy_workers() -> None:
    times = ServiceTimeEstimator()
    times.observe(2.0)
    lim = FixedLimit(workers=2, max_queue=2, service_times=times)
    lim.note_load(9.0, running=1, queued=0)  # one huge request: a fixed gate ignores the weights
    assert lim.allows(9.0) and lim.predicted_wait_s() == 0.0  # a worker is idle
    lim.note_load(4.0, running=2, queued=1)
    assert lim.allows(4.0) and lim.predicted_wait_s() == pytest.approx(2.0 * 1.5)  # both busy, one ahead
    lim.note_load(4.0, running=2, queued=2)
    assert not lim.allows(4.0) and lim.retry_after_s(0.0) == 4.0  # full: ceil(2 s x (1 + 2/2))
    lim.start_at(1)
    lim.observe(100.0, admitted_at=0.0)
    assert lim.value == 4 and lim.target_s is None  # nothing moves it


# -- the unloaded latency ----------------------------------------------------------------------------
def test_the_baseline_prefers_lone_requests_then_the_lowest_window_then_the_lowest_sample() -> None:
    clock = Clock()
    base = Baseline(budget_s=None, tolerance=2.0, clock=clock)
    assert base.unloaded_s is None and base.target_s is None
    base.observe(0.5)
    assert base.unloaded_s == 0.5  # the lowest sample
    base.observe_window(0.8)
    assert base.unloaded_s == 0.8 and base.target_s == pytest.approx(1.6)  # a window's median beats one sample
    for s in (1.0, 1.1, 1.2):
        base.observe(s, alone=True)
    assert base.unloaded_s == 1.1  # the median of the lone ones
    clock.t = UNLOADED_HORIZON_S + 1.0
    assert base.unloaded_s == 0.8  # they aged out: back to the stand-in


def test_an_operators_budget_is_the_target_whatever_is_measured() -> None:
    base = Baseline(budget_s=3.0, tolerance=2.0, clock=Clock())
    base.observe(0.1, alone=True)
    assert base.target_s == 3.0 and base.unloaded_s == 0.1


# -- the waiting room --------------------------------------------------------------------------------
def test_the_waiting_room_runs_at_once_within_the_limit_and_on_an_idle_server() -> None:
    room = WaitingRoom()
    assert room.admits(1.0, 1.0, limit=2, rate=None, target=None)  # fits
    assert room.admits(0.0, 20.0, limit=2, rate=None, target=None)  # idle: even a huge one
    assert not room.admits(2.0, 1.0, limit=2, rate=None, target=None)  # nothing measured: no room
    assert room.predicted_wait_s(1.0, 1.0, limit=2, rate=1.0, target=2.0) == 0.0


def test_the_waiting_room_admits_a_round_or_the_budget_and_predicts_the_drain() -> None:
    room = WaitingRoom(max_wait_s=10.0)
    # 4 running finish 2 a second: one round is 2 s; 6 admitted, 1 more: (6 - 4 + 1) / 2 = 1.5 s of wait
    assert room.wait_s(6.0, 1.0, limit=4, rate=2.0) == pytest.approx(1.5)
    assert room.admits(6.0, 1.0, limit=4, rate=2.0, target=0.5)  # within one round, whatever the budget
    assert not room.admits(8.0, 1.0, limit=4, rate=2.0, target=0.5)  # 2.5 s: past the round and the budget
    assert room.admits(8.0, 1.0, limit=4, rate=2.0, target=4.5)  # 2.5 s + 2 s of service: within 4.5 s
    promised = WaitingRoom(promise=True)  # an operator's budget: only the budget test admits a wait
    assert not promised.admits(6.0, 1.0, limit=4, rate=2.0, target=3.0)  # 1.5 + 2 > 3 x 1.1
    assert not WaitingRoom(max_wait_s=1.0).admits(6.0, 1.0, limit=4, rate=2.0, target=9.0)  # past the timeout
    assert room.predicted_wait_s(6.0, 1.0, limit=4, rate=None, target=4.0) == pytest.approx(3.0)  # 4 per 4 s


# -- the knee search ---------------------------------------------------------------------------------
def busy_window(at: float, latency: float, running: float, samples: int = 30) -> Window:
    return Window(latency, at, samples, latency, running, 0.0)


def test_levels_tell_throughput_by_littles_law_from_busy_windows_only() -> None:
    levels = Levels(level_samples=24)
    levels.add(2, busy_window(1.0, latency=0.5, running=2.0))  # 2 running, 0.5 s each: 4 a second
    levels.add(3, Window(0.5, 1.0, 30, 0.5, None, 0.0))  # not kept busy: says nothing of capacity
    assert levels.throughput(2) == pytest.approx(4.0) and levels.throughput(3) is None
    assert levels.rate(3) == pytest.approx(4.0) and levels.rate(1) == pytest.approx(2.0)  # 2's, scaled to 1
    assert levels.missed(2, target=0.4) and not levels.missed(2, target=0.5)


def test_a_level_of_slow_requests_is_pooled_until_its_windows_hold_enough_requests() -> None:
    levels = Levels(level_samples=24)
    for i in range(12):  # full-size requests: a window at 2 closes on 2 of them
        levels.add(2, busy_window(float(i), latency=9.3, running=2.0, samples=2))
    assert levels.throughput(2) == pytest.approx(2 / 9.3)  # 12 windows, 24 requests (8 would hold 16: unknown)
    levels.add(2, Window(9.3, 12.0, 30, 9.3, None, 0.0))  # a light spell still displaces the overload's windows
    assert levels.throughput(2) is None


def test_a_level_judged_clearly_worse_stays_known_while_its_windows_are_the_same() -> None:
    levels = Levels(level_samples=24)
    for i in range(8):
        levels.add(3, busy_window(float(i), latency=10.0, running=3.0, samples=3))  # 0.3/s, known
    for i in range(4):
        levels.add(2, busy_window(10.0 + i, latency=9.0, running=2.0, samples=3))  # 12 requests at 0.222/s
    assert levels.throughput(2) == pytest.approx(2 / 9.0)  # under 80 % of 3's: clearly worse, probe over
    levels.add(3, busy_window(20.0, latency=17.0, running=3.0, samples=3))  # 3's rate wobbles down to 0.276/s
    assert 2 / 9.0 > 0.8 * levels.throughput(3)  # no longer under 80 % of it ...
    assert levels.throughput(2) == pytest.approx(2 / 9.0)  # ... but the verdict on the same windows stands
    levels.add(2, busy_window(21.0, latency=7.0, running=2.0, samples=3))  # a new window: judged afresh
    assert levels.throughput(2) is None


def test_where_requests_are_slow_a_level_is_trusted_for_requests_as_well_as_seconds() -> None:
    levels = Levels(level_samples=24)
    for i in range(8):
        levels.add(2, busy_window(float(i), latency=9.3, running=2.0, samples=3))
    levels.loaded_s = 400.0  # past PROBE_AFTER_S of load, but only 24 requests since: still trusted
    assert levels.throughput(2) is not None
    for i in range(160):  # 480 requests more (24 / PROBE_SHARE) at another level: now it is stale
        levels.add(3, busy_window(10.0 + i, latency=11.3, running=3.0, samples=3))
    assert levels.throughput(2) is None


def test_the_knee_search_steps_down_by_littles_law_over_budget_and_to_the_fewest_that_pay() -> None:
    levels = Levels(level_samples=24)
    knee = KneeSearch(levels)
    assert knee.decide(8.0, 8, ratio=0.25, crowded=True, target=1.0) == 4.0  # over budget: at most halved
    levels.add(2, busy_window(1.0, latency=0.5, running=2.0))  # 4/s
    levels.add(3, busy_window(2.0, latency=0.74, running=3.0))  # 4.05/s: 1 % more, at 1.5x the latency
    assert knee.decide(3.0, 3, ratio=1.0, crowded=True, target=0.74) == 2.5  # 2 scores as well: the knee is below
    assert knee.decide(2.0, 2, ratio=1.5, crowded=True, target=0.75) == 1.5  # 1 unknown: probe it
    assert knee.score(2, 4.0) > knee.score(3, 4.05)  # the latency 3 adds costs more than it buys


def test_the_knee_search_grows_by_the_headroom_only_when_crowded_and_far_under_budget() -> None:
    knee = KneeSearch(Levels())
    assert knee.decide(4.0, 4, ratio=3.0, crowded=True, target=3.0) == 6.0  # x1.5 at most
    assert knee.decide(4.0, 4, ratio=3.0, crowded=False, target=3.0) == 4.0  # nobody asked for more
    assert knee.decide(4.0, 4, ratio=1.5, crowded=True, target=3.0) == 4.0  # near the budget, 4 unknown: dwell


# -- the settings ------------------------------------------------------------------------------------
def test_every_admission_setting_a_user_may_have_still_loads_and_reaches_the_limit(tmp_path, monkeypatch) -> None:
    # the limit's other knobs were never user settings (Settings forbids unknown keys): these are all of them
    from app.settings import load_settings
    from app.settings.runtime import pool_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("pool:\n  admission: adaptive\n  admission_budget_s: 4\n  queue_timeout_s: 12\n"
                   "  workers: 2\n  max_queue: 1\n")
    monkeypatch.setenv("COSYSERVE_POOL__ADMISSION_TOLERANCE", "3.5")
    adm = Admission.for_pool(pool_config(load_settings(cfg)), NullObserver())
    lim = adm.limiter
    assert isinstance(lim, AdaptiveLimit) and adm.capacity == 3
    assert (lim.config.budget_s, lim.config.tolerance, lim.config.max_wait_s) == (4.0, 3.5, 12.0)
