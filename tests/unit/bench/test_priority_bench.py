"""bench/priority.py's pure parts: options, the backlog's summary, the goals, the side-by-side table."""

from __future__ import annotations

from bench.lib.load import Result
from bench.priority import parse_args, spec
from bench.report import (
    backlog_summary,
    limit_readings,
    priority_goals,
    priority_markdown,
    priority_table,
)


def loop(p99: float, ttfa99: float, goodput: float, rejected: int = 0) -> dict:
    return {"ok": 50, "rejected": rejected, "errors": 0, "timeouts": 0, "failed": 0, "audio_per_s": goodput,
            "latency_p50_s": p99 / 2, "latency_p99_s": p99, "ttfa_p50_s": ttfa99 / 2, "ttfa_p99_s": ttfa99}


def bulk(ok: int = 200, rejected: int = 0, failed: int = 0, goodput: float = 1.0, wait: float = 30.0) -> dict:
    return {"requests": ok + rejected + failed, "ok": ok, "rejected": rejected, "failed": failed,
            "completion_s": 90.0, "audio_s": 800.0, "audio_per_s": goodput, "ttfa_p50_s": 10.0,
            "latency_p50_s": 11.0, "latency_p99_s": 80.0, "max_wait_s": wait}


def results(beside_p99: float = 1.05, bulk_b: dict | None = None, bulk_c: dict | None = None,
            bulk_goodput: float = 1.0) -> dict:
    return {"knee": {"concurrency": 2, "best_audio_per_s": 5.0, "swept": [1, 2, 4]}, "bulk_timeout_s": 600.0,
            "backlog": 200, "phase_s": 60.0, "model": "tiny", "cores": 2,
            "phases": {"A": {"interactive": loop(1.0, 0.5, 4.2)},
                       "B": {"interactive": loop(beside_p99, 0.5 * beside_p99, 4.0),
                             "bulk": bulk_b or bulk(goodput=bulk_goodput)},
                       "C": {"bulk": bulk_c or bulk()}}}


GOODPUT = "total goodput beside the backlog / the knee's loop alone (A, A2)"


def passed(goals: list[dict]) -> dict[str, bool | None]:
    return {g["goal"]: g["pass"] for g in goals}


def test_the_goals_pass_when_interactive_keeps_its_latency_and_bulk_fills_the_rest():
    goals = passed(priority_goals(results()))
    assert all(goals.values()), goals
    assert len(goals) == 7


def test_each_goal_fails_on_its_own_numbers():
    goals = passed(priority_goals(results(beside_p99=1.2)))
    assert not goals["interactive p99 latency beside the backlog / alone"]
    assert not goals["interactive p99 TTFA beside the backlog / alone"]
    assert passed(priority_goals(results(bulk_goodput=0.0)))[GOODPUT]  # (4.0 + 0) / 4.2 = 0.952
    r = results(bulk_goodput=0.0)
    r["phases"]["B"]["interactive"]["audio_per_s"] = 3.9  # 3.9 / 4.2 = 0.93
    assert not passed(priority_goals(r))[GOODPUT]
    goals = passed(priority_goals(results(bulk_b=bulk(ok=199, rejected=1), bulk_c=bulk(wait=601.0))))
    assert not goals["backlog (B) 503s and failures"] and goals["backlog (C) 503s and failures"]
    assert goals["backlog (B) longest wait, s"] and not goals["backlog (C) longest wait, s"]


def test_goodput_is_graded_against_the_knees_loop_alone_on_both_sides_of_b():
    r = results(bulk_goodput=0.0)
    r["phases"]["B"]["interactive"]["audio_per_s"] = 4.0
    r["phases"]["A2"] = {"interactive": loop(1.0, 0.5, 4.0)}  # alone: sqrt(4.2 * 4.0) = 4.099
    g = {x["goal"]: x for x in priority_goals(r)}[GOODPUT]
    assert g["pass"] is True and g["value"] == "0.976" and "the sweep's best point 0.800" in g["noise"]
    r["phases"]["A2"] = {"interactive": loop(1.0, 0.5, 3.6)}  # A2/A 0.857: the host moved past the margin
    r["phases"]["B"]["interactive"]["audio_per_s"] = 3.9  # 0.93x A's, 1.08x A2's: met against one only
    assert passed(priority_goals(r))[GOODPUT] is None


def test_a_missing_phase_grades_none_not_pass():
    r = results()
    del r["phases"]["B"]
    goals = passed(priority_goals(r))
    assert goals["interactive p99 latency beside the backlog / alone"] is None
    assert goals["backlog (B) 503s and failures"] is None
    assert priority_goals({}) and all(g["pass"] is None for g in priority_goals({}))


def test_backlog_summary_counts_completion_goodput_and_the_longest_wait():
    rs = [Result(10.0, 200, 4.0, 1.0, 100, "ok", audio_s=2.0), Result(10.0, 200, 10.0, 6.0, 100, "ok", audio_s=2.0),
          Result(10.0, 503, 0.1, None, 0, "rejected"), Result(10.0, 0, 120.0, None, 0, "timeout")]
    s = backlog_summary(rs)
    assert (s["requests"], s["ok"], s["rejected"], s["failed"]) == (4, 2, 1, 1)
    assert s["completion_s"] == 120.0 and s["audio_s"] == 4.0 and s["max_wait_s"] == 6.0
    assert abs(s["audio_per_s"] - 4.0 / 120.0) < 1e-9
    # counted from first audio: the first's 2 s of audio over 11-14 s (all in), the second's over 16-20 s (none)
    windowed = backlog_summary(rs[:2], window=(10.0, 14.0))
    assert abs(windowed["audio_per_s"] - 2.0 / 4.0) < 1e-9


def test_the_table_puts_the_phases_side_by_side():
    text = priority_table(results())
    lines = text.splitlines()
    assert "A: interactive alone" in lines[0] and "C: bulk backlog alone" in lines[0]
    row = next(line for line in lines if line.startswith("| interactive latency p99, ms"))
    assert row.split("|")[2:6] == [" 1000 ", " 1050 ", "  ", "  "]  # A, B, A2 (not run here), C
    row = next(line for line in lines if line.startswith("| bulk ok / submitted"))
    assert row.split("|")[2:6] == ["  ", " 200 / 200 ", "  ", " 200 / 200 "]
    report = priority_markdown({**results(), "goals": priority_goals(results())})
    assert report.startswith("# Live and bulk") and "| PASS |" in report


def test_the_limit_each_loop_ran_under_is_summarised_and_shown_beside_the_phases():
    assert limit_readings([]) is None
    lim = limit_readings([3.0, 3.0, 2.0, 3.0])
    assert lim == {"mean": 2.75, "readings": 4, "shares": {"2": 0.25, "3": 0.75}}
    assert not any(line.startswith("| admission limit") for line in priority_table(results()).splitlines())
    r = results()
    r["phases"]["A"]["limit"] = lim
    r["phases"]["B"]["limit"] = limit_readings([2.0, 2.0])
    row = next(line for line in priority_table(r).splitlines() if line.startswith("| admission limit"))
    assert row.split("|")[2:6] == [" 2.75 (2: 25 %, 3: 75 %) ", " 2.00 (2: 100 %) ", "  ", "  "]


def test_options_and_the_requests():
    quick = parse_args(["--quick"])
    assert quick.backlog < 200 and quick.phase_s < 60 and quick.concurrency == [1, 2]
    full = parse_args(["--concurrency", "2, 4", "--out", "x"])
    assert full.backlog == 200 and full.concurrency == [2, 4] and str(full.out) == "x"
    assert spec("bulk").json["priority"] == "bulk" and "priority" not in spec().json


def test_alone_is_a_and_a2_together_and_drift_past_the_margin_is_not_resolvable():
    r = results(beside_p99=1.15)
    r["phases"]["A2"] = {"interactive": loop(1.1, 0.55, 4.2)}  # alone: sqrt(1.0 * 1.1) = 1.049
    g = {x["goal"]: x for x in priority_goals(r)}["interactive p99 latency beside the backlog / alone"]
    assert g["pass"] is True and g["value"] == "1.096" and "A2/A 1.100" in g["noise"]
    r["phases"]["A2"] = {"interactive": loop(1.3, 0.65, 4.2)}  # the host moved 30 % between A and A2
    g = {x["goal"]: x for x in priority_goals(r)}["interactive p99 latency beside the backlog / alone"]
    assert g["pass"] is None and "not resolvable" in g["noise"]  # 1.15x A's, 0.88x A2's


def test_past_the_drift_a_goal_met_or_missed_against_each_alone_phase_is_graded():
    r = results(beside_p99=1.05)
    r["phases"]["A2"] = {"interactive": loop(1.3, 0.65, 4.2)}  # A2/A 1.3: past the 1.1x margin
    goals = {x["goal"]: x for x in priority_goals(r)}
    g = goals["interactive p99 latency beside the backlog / alone"]
    assert g["pass"] is True and "met against each" in g["noise"] and "B/A 1.050" in g["noise"]
    r = results(beside_p99=1.5)
    r["phases"]["A2"] = {"interactive": loop(1.3, 0.65, 4.2)}
    g = {x["goal"]: x for x in priority_goals(r)}["interactive p99 latency beside the backlog / alone"]
    assert g["pass"] is False and "missed against each" in g["noise"]
    r = results(bulk_goodput=0.0)  # B: 4.0 audio s/s in all
    r["phases"]["A2"] = {"interactive": loop(1.0, 0.5, 3.7)}  # A2/A 0.88: past the 0.95x margin
    assert passed(priority_goals(r))[GOODPUT] is True  # 0.952x A's, 1.08x A2's
    r["phases"]["A"]["interactive"]["audio_per_s"] = 4.6  # 0.87x A's: met against A2 only
    assert passed(priority_goals(r))[GOODPUT] is None
