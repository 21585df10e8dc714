"""The admission benchmark's pure parts (bench/report.py): settling, the knee, the goals."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.admission import parse_args, pool_settings
from bench.report import (
    admission_goals,
    admission_markdown,
    admission_rows,
    knee,
    per_point,
    settle_times,
)


def point(c: int, rps: float, p50: float, p99: float) -> dict:
    return {"concurrency": c, "throughput_rps": rps, "audio_per_s": rps * 3, "latency_p50_s": p50,
            "latency_p99_s": p99, "ttfa_p50_s": 0.3, "rejected": 0, "reject_p99_s": None, "errors": 0,
            "timeouts": 0}


def test_settle_times_measure_from_each_load_change_to_the_last_limit_change():
    series = [{"t": t / 2, "limit": 4} for t in range(0, 20)]  # 0..9.5 s: 4
    series += [{"t": 10 + t / 2, "limit": 6 if t < 6 else 5} for t in range(0, 20)]  # step at 10 s: 6, then 5 at 13 s
    series += [{"t": 20 + t / 2, "limit": 5} for t in range(0, 20)]  # back to 0.5x at 20 s: no change
    assert settle_times({"series": series, "step_s": 10.0, "poll_offset_s": 0.0}) == [3.0, 0.0]
    assert settle_times({"series": [], "step_s": 10.0}) == [None, None]


def test_the_knee_is_the_fewest_clients_at_nine_tenths_of_the_best():
    pts = [point(1, 0.8, 1.0, 1.2), point(2, 1.1, 1.7, 2.0), point(4, 1.2, 3.2, 3.6), point(8, 1.25, 6, 7)]
    assert knee(pts)["concurrency"] == 4  # 1.2 >= 0.9 x 1.25 = 1.125 > 1.1
    assert knee([]) is None


def test_goals_grade_the_defaults_and_show_the_others():
    defaults = {"points": [point(1, 0.8, 1.0, 1.2), point(2, 1.1, 1.7, 2.0), point(8, 1.25, 6.0, 7.0)],
                "open": [{"factor": 3.0, **point(0, 1.2, 3.0, 3.8), "rejected": 40, "reject_p99_s": 0.004}],
                "step": {"settle_s": [4.0, 0.0]}, "server_503": {"count": 40, "p50_ms": 0.2, "p99_ms": 12.5}}
    before = {"points": [point(1, 0.8, 1.0, 1.2), point(2, 1.1, 1.7, 2.0), point(8, 1.3, 6.0, 16.9)],
              "open": [{"factor": 3.0, **point(0, 0.9, 17.0, 35.0)}]}
    goals = {g["goal"]: g for g in admission_goals({"systems": {"defaults": defaults, "before": before}})}
    assert goals["[defaults] open loop 3x: admitted p99 / p99 at the knee"]["pass"] is True  # 3.8 / 2.0
    assert goals["[defaults] open loop 3x: 503 p99 (ms)"]["pass"] is True
    assert goals["[defaults] 503 p99 as the server timed it, whole run (ms)"]["pass"] is False  # 12.5 ms
    assert goals["[defaults] c=8: p99 / p50 (starvation)"]["pass"] is True
    assert goals["[defaults] step 0.5x -> 3x -> 0.5x: the limit settles within (s)"]["pass"] is True
    assert goals["[before] c=8: p99 / p50 (starvation)"]["pass"] is None  # shown, not graded
    assert goals["[before] open loop 3x: admitted p99 / p99 at the knee"]["value"] == "2.07"  # its knee: c=8
    assert goals["[defaults] c=8: throughput / best fixed"]["value"] == "0.96"  # 1.25 / 1.3
    assert goals["[defaults] c=8: throughput / best fixed"]["pass"] is True
    defaults["points"][1] = point(2, 0.9, 1.7, 2.0)
    goals = {g["goal"]: g for g in admission_goals({"systems": {"defaults": defaults, "before": before}})}
    assert goals["[defaults] c=2: throughput / best fixed"]["pass"] is False  # 0.9 / 1.1


def test_the_defaults_system_has_no_pool_settings_and_the_report_renders():
    args = parse_args(["--quick"])
    assert pool_settings("defaults", args) == {}
    assert pool_settings("before", args) == {"admission": "fixed"}
    assert pool_settings("tuned", args)["admission"] == "fixed"
    r = {"config": vars(args) | {"out": str(args.out)}, "started": "now", "cores": 2, "model": "tiny", "text": "x",
         "loadavg_start": [0.1], "loadavg_end": [0.2],
         "systems": {"defaults": {"pool": {}, "points": [point(1, 0.8, 1.0, 1.2)], "open": [],
                                  "step": {"series": [{"t": 0.0, "limit": 4.0}], "step_s": 4.0, "settle_s": [0, 0],
                                           "phases": []}}}}
    r["goals"] = admission_goals(r)
    text = admission_markdown(r)
    assert "| closed c=1 | 0.80 |" in text and "0s:4" in text


def test_rounds_of_a_point_report_the_median_round_with_counts_summed():
    rounds = [point(2, 6.0, 0.30, 0.50), point(4, 7.0, 0.5, 0.8), point(2, 7.4, 0.25, 0.40),
              point(4, 5.0, 0.7, 0.9), point(2, 6.6, 0.27, 0.45), point(4, 6.5, 0.6, 0.85)]
    rounds[0]["rejected"], rounds[2]["rejected"] = 3, 4
    merged = per_point(rounds, "concurrency")
    assert [p["concurrency"] for p in merged] == [2, 4]  # first-seen order
    two = merged[0]
    assert two["throughput_rps"] == 6.6 and two["latency_p99_s"] == 0.45  # the median round, whole
    assert two["rounds"] == [6.0, 7.4, 6.6] and two["rejected"] == 7
    assert merged[1]["throughput_rps"] == 6.5
    assert per_point([point(1, 3.0, 0.2, 0.3)], "concurrency") == [point(1, 3.0, 0.2, 0.3)]  # one round: as measured
    even = per_point([point(1, 3.0, 0.2, 0.3), point(1, 4.0, 0.2, 0.3)], "concurrency")
    assert even[0]["throughput_rps"] == 3.0  # an even count: the lower middle (never an optimistic pick)


def test_a_re_run_best_point_names_every_round_s_clients_where_they_differ():
    refs = [dict(point(c, x, 0.3, 0.5), factor=1.5) for c, x in ((8, 6.0), (4, 6.5), (8, 7.0))]
    merged = per_point(refs, "factor")[0]
    assert merged["concurrency"] == 4 and merged["concurrencies"] == [8, 4, 8]
    assert admission_rows({"refs": [merged]})[0][0] == "closed c=8/4/8 again, before 1.5x"
    same = per_point([dict(point(8, x, 0.3, 0.5), factor=3.0) for x in (6.0, 7.0)], "factor")[0]
    assert "concurrencies" not in same and admission_rows({"refs": [same]})[0][0] == "closed c=8 again, before 3x"


def test_rounds_interleave_every_point_and_the_report_shows_their_range():
    from bench.admission import SystemRun

    args = parse_args(["--quick", "--rounds", "2", "--concurrency", "1,2", "--factors", "3"])

    class Srv:
        base_url = "http://x"

    run = SystemRun("defaults", Srv(), args)
    plan = [(getattr(f, "func", f).__name__, getattr(f, "args", ())) for _, f in run.plan()]
    # each open-loop rate right after the best closed point measured again (the host drifts within minutes)
    assert plan == [("warm", ()), ("closed", (1,)), ("closed", (2,)), ("reference", (3.0,)), ("overload", (3.0,)),
                    ("closed", (1,)), ("closed", (2,)), ("reference", (3.0,)), ("overload", (3.0,)), ("step", ())]
    no_step = SystemRun("defaults", Srv(), parse_args(["--quick", "--step-s", "0", "--no-paired"]))
    names = [getattr(f, "func", f).__name__ for _, f in no_step.plan()]
    assert "step" not in names and "reference" not in names
    run.out["points"] = [point(1, 3.0, 0.2, 0.3), point(1, 3.4, 0.2, 0.3)]
    report = run.report()
    assert report["points"][0]["rounds"] == [3.0, 3.4] and len(report["points_rounds"]) == 2
    r = {"config": vars(args) | {"out": str(args.out)}, "started": "now", "cores": 2, "model": "tiny", "text": "x",
         "loadavg_start": [0.1], "loadavg_end": [0.2], "systems": {"defaults": report}}
    r["goals"] = admission_goals(r)
    text = admission_markdown(r)
    assert "| closed c=1 | 3.00 (3.00-3.40 of 2) |" in text and "measured in 2 rounds" in text
    assert "load generator ran in" not in text  # not recorded: not claimed
    r["load_generator"] = "SCHED_FIFO priority 1, servers in SCHED_OTHER"
    assert "The load generator ran in SCHED_FIFO priority 1, servers in SCHED_OTHER" in admission_markdown(r)


def test_the_report_names_no_path_outside_the_repository(tmp_path):
    from bench.lib.procs import ROOT, shown

    assert shown(ROOT / ".cache" / "bench" / "admission") == ".cache/bench/admission"
    assert shown(tmp_path / "models" / "full2") == "full2"
    assert shown(None) is None


def test_the_servers_run_niced_below_the_load_generator_unless_told_not_to(tmp_path):
    from bench.admission import server

    niced = server("defaults", parse_args(["--quick"]), "model", tmp_path)
    assert niced.argv[:3] == ["nice", "-n", "5"] and "app.cli" in niced.argv
    plain = server("defaults", parse_args(["--quick", "--server-nice", "0"]), "model", tmp_path)
    assert plain.argv[0] != "nice"


_SCHED_PROBE = """
import os, subprocess, sys
from bench.lib.sched import realtime_client
with realtime_client(int(sys.argv[1])) as how:
    mine = os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK
    child = subprocess.check_output([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"])
print(how)
print(mine, int(child), os.sched_getscheduler(0))
"""


def _sched_probe(priority: int) -> tuple[str, list[int]]:
    from bench.lib.procs import ROOT

    out = subprocess.run([sys.executable, "-c", _SCHED_PROBE, str(priority)], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout.splitlines()
    return out[0], [int(x) for x in out[1].split()]


def test_a_realtime_load_generator_starts_its_servers_in_the_normal_class():
    how, (mine, child, after) = _sched_probe(1)
    assert child == os.SCHED_OTHER and after == os.SCHED_OTHER  # servers, and the process once done
    if how.startswith("SCHED_FIFO"):
        assert mine == os.SCHED_FIFO
    else:  # no CAP_SYS_NICE here: nothing changed, and the report says why
        assert "not permitted" in how and mine == os.SCHED_OTHER


def test_priority_zero_leaves_the_load_generator_as_it_is():
    how, (mine, child, after) = _sched_probe(0)
    assert "off" in how and mine == child == after == os.SCHED_OTHER


def test_a_closed_loop_client_honours_the_retry_after_of_a_503_unless_given_a_fixed_pause(monkeypatch):
    import asyncio
    import time

    from bench.lib import load

    sent: list[float] = []

    async def refused(self, spec):
        sent.append(time.monotonic())
        return load.Result(time.monotonic(), 503, 0.001, None, 0, "rejected", retry_after="2")

    monkeypatch.setattr(load.LoadClient, "send", refused)
    spec = load.RequestSpec("POST", "/v1/tts", json={})
    asyncio.run(load.closed_loop("http://127.0.0.1:9", spec, 1, 0.6, reject_backoff_s=None))
    assert len(sent) == 1  # it waited the 2 s named (cut at the end of the phase), not 0.1 s
    sent.clear()
    asyncio.run(load.closed_loop("http://127.0.0.1:9", spec, 1, 0.6, reject_backoff_s=0.1))
    assert 4 <= len(sent) <= 7
    assert load.retry_pause_s("3") == 3.0 and load.retry_pause_s(None) == 1.0
    assert load.retry_pause_s("Wed, 21 Oct 2026 07:28:00 GMT") == 1.0  # a date: the default pause


def test_goodput_is_also_graded_against_the_best_point_measured_just_before_it():
    from bench.report import paired_ratios

    opened = [{"factor": 1.5, "throughput_rps": 7.0}, {"factor": 3.0, "throughput_rps": 6.0},
              {"factor": 1.5, "throughput_rps": 5.0}, {"factor": 3.0, "throughput_rps": 6.6}]
    refs = [{"factor": 1.5, "throughput_rps": 7.0}, {"factor": 3.0, "throughput_rps": 8.0},
            {"factor": 1.5, "throughput_rps": 5.5}, {"factor": 3.0, "throughput_rps": 6.0}]
    pairs = paired_ratios(opened, refs)
    assert pairs == [{"factor": 1.5, "ratios": [1.0, 0.9091], "median": 0.95455},
                     {"factor": 3.0, "ratios": [0.75, 1.1], "median": 0.925}]
    defaults = {"points": [point(2, 8.0, 0.25, 0.4)], "paired": pairs,
                "open": [dict(point(0, 7.0, 0.3, 0.5), factor=1.5), dict(point(0, 6.0, 0.3, 0.5), factor=3.0)]}
    goals = {g["goal"]: g for g in admission_goals({"systems": {"defaults": defaults}})}
    row = next(g for name, g in goals.items() if name.startswith("[defaults] open loop 1.5x: throughput / the best "
                                                                   "closed point re-measured"))
    assert row["value"] == "0.95" and row["pass"] is True and "1.00 / 0.91" in row["goal"]
    row3 = next(g for name, g in goals.items() if "3x: throughput / the best closed point re-measured" in name)
    assert row3["pass"] is False
    assert goals["[defaults] open loop 1.5x: throughput / best closed loop"]["value"] == "0.88"  # still shown


def test_systems_take_their_turns_in_reversed_order_in_odd_rounds():
    from bench.admission import SystemRun, turns

    args = parse_args(["--quick", "--rounds", "3", "--concurrency", "1,2", "--factors", "3"])

    class Srv:
        base_url = "http://x"

    runs = {name: SystemRun(name, Srv(), args) for name in ("defaults", "before", "tuned")}
    plans = {name: run.plan() for name, run in runs.items()}
    first_at_c1 = []
    for i, (r, call) in enumerate(plans["defaults"]):
        order = [name for name, _ in turns(runs, plans, i)]
        assert order == (["tuned", "before", "defaults"] if r % 2 else ["defaults", "before", "tuned"])
        if getattr(call, "args", ()) == (1,) and getattr(call, "func", call).__name__ == "closed":
            first_at_c1.append(order[0])
    assert first_at_c1 == ["defaults", "tuned", "defaults"]  # ABC CBA ABC: no system always first
    assert plans["defaults"][0][0] == 0 and plans["defaults"][-1][0] == 2  # warm-up first, step test last
    shorter = {**plans, "tuned": plans["tuned"][:3]}  # a system whose plan ended (failed) takes no turn
    assert [name for name, _ in turns(runs, shorter, 3)] == ["defaults", "before"]


def test_the_re_run_best_point_reads_the_gauges_as_the_open_loop_it_is_paired_with_does(monkeypatch):
    """A scrape of /metrics costs the server CPU: the reference and the open loop must both pay it."""
    import asyncio

    from bench import admission
    from bench.admission import SystemRun
    from bench.lib import load

    polling: list[bool] = []
    active = {"n": 0}

    class FakePoller(admission.Poller):  # the real one's readings, without a server to read them from
        def __init__(self, url, t0, every_s=0.5):
            self.series = [{"t": 0.0, "limit": 2.0}, {"t": 0.5, "limit": None}, {"t": 1.0, "limit": 3.0}]

        def __enter__(self):
            active["n"] += 1
            return self

        def __exit__(self, *exc):
            active["n"] -= 1

    async def closed_loop(url, spec, c, seconds, **kw):
        polling.append(active["n"] > 0)
        return load.Summary(requests=10, ok=10, rejected=0, timeouts=0, errors=0, elapsed_s=1.0, throughput_rps=5.0)

    monkeypatch.setattr(admission, "Poller", FakePoller)
    monkeypatch.setattr(load, "closed_loop", closed_loop)

    class Srv:
        base_url = "http://x"

    run = SystemRun("defaults", Srv(), parse_args(["--quick"]))
    run.out["points"] = [point(2, 5.0, 0.3, 0.5)]
    asyncio.run(run.reference(1.5))
    assert polling == [True]
    assert run.out["refs"][0]["limits"] == [2.0, 3.0] and run.out["refs"][0]["concurrency"] == 2
