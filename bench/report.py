"""Every suite's goals and Markdown report from its run's JSON: the shared helpers, then one section a suite."""

from __future__ import annotations

import json
import operator
import re
import statistics
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from bench.lib.load import Result, percentile, work_in_window

MB, PER_MB, PER_GB = 1024 * 1024, 2**-20, 2**-30  # bytes in a MB (MiB); MB and GB (GiB) in a byte


def fmt(v: float | None, nd: int = 2, scale: float = 1.0, unit: str = "") -> str:
    """``v * scale`` to ``nd`` places, then ``unit``; None as "-"."""
    return "-" if v is None else f"{v * scale:.{nd}f}{unit}"


def ms(v: float | None, nd: int = 0, unit: str = "") -> str:
    """Seconds as milliseconds (``unit`` " ms": with the unit)."""
    return fmt(v, nd, 1000, unit)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def goal(name: str, value: Any, target: str, ok: bool | None, **extra: str) -> dict[str, Any]:
    """One goal, as every suite lists it: a float value shown to 3 places, None as "-"; ``extra``: more columns."""
    shown = f"{value:.3f}" if isinstance(value, float) else "-" if value is None else str(value)
    return {"goal": name, "value": shown, "target": target, "pass": ok, **extra}


def add_goal(goals: list, *args: Any, **extra: str) -> None:
    goals.append(goal(*args, **extra))


BOUNDS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt}


def bound(goals: list, name: str, value: float | None, target: str, *, nd: int = 2, scale: float = 1.0,
          shown: str | None = None, graded: bool = True, **extra: str) -> None:
    """A goal whose target is a bound ("<= 2", ">= 0.95"): met when ``value * scale`` is within it, shown to ``nd``
    places unless ``shown``; None (not measured, or not ``graded``): neither met nor missed."""
    op, limit = target.split(" ", 1)
    v = None if value is None else value * scale
    ok = None if v is None or not graded else BOUNDS[op](v, float(limit))
    add_goal(goals, name, fmt(v, nd) if shown is None else shown, target, ok, **extra)


def verdict(g: dict) -> str:
    return {True: "PASS", False: "FAIL", None: "info" if g["target"] == "info" else "n/a"}[g["pass"]]


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def goals_table(goals: list[dict], lead: tuple[str, ...] = (), tail: tuple[str, ...] = ()) -> list[str]:
    """The goals as a Markdown table: ``lead`` columns, goal, value, target, result, ``tail`` columns."""
    return table([*lead, "goal", "value", "target", "result", *tail],
                 [[*(g.get(k, "") for k in lead), g["goal"], g["value"], g["target"], verdict(g),
                   *(g.get(k, "") for k in tail)] for g in goals])


def save(out: Path, name: str, doc: dict | None, markdown: str) -> None:
    """A suite's raw JSON and its Markdown report: OUT/NAME.json (``doc`` None: none), OUT/NAME.md."""
    out.mkdir(parents=True, exist_ok=True)
    if doc is not None:
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown)
    print(f"wrote {out}/{name}{'.json, ' + name if doc is not None else ''}.md", flush=True)


def print_goals(goals: list[dict], title: str = "Goals") -> None:
    print(f"\n{title}")
    for g in goals:
        where = f"{g['phase']}: " if g.get("phase") else ""
        more = f" {g['detail']}" if g.get("detail") else f" {g['noise']}" if g.get("noise") else ""
        print(f"  [{verdict(g)}] {where}{g['goal']}: {g['value']} (target {g['target']}){more}")


# run ---------------------------------------------------------------------------------------------

def _pool_text(cfg: dict) -> str:
    """cosyserve's pool settings in a run: none means the server's defaults."""
    parts = [f"{k}={cfg[c]}" for k, c in (("workers", "server_workers"), ("max_queue", "max_queue"))
             if cfg.get(c) is not None]
    return ", ".join(parts) if parts else "the server's defaults (no pool settings)"


def _run_point(system: dict, concurrency: int) -> dict | None:
    return next((p for p in system.get("points", []) if p["concurrency"] == concurrency), None)


def drift(series: list[float | None]) -> tuple[float, float] | None:
    """Median of the first and of the last k values (k = min(10, n/4))."""
    vals = [v for v in series if v is not None]
    if len(vals) < 2:
        return None
    k = max(1, min(10, len(vals) // 4))
    return statistics.median(vals[:k]), statistics.median(vals[-k:])


def run_goals(r: dict) -> list[dict]:
    goals: list[dict] = []
    workers = r["config"]["workers"]
    th, b = r.get("ceiling_threads"), r["systems"].get("cosyserve") or {}
    ceiling = th["cw"]["throughput_rps"] if th else None
    for p in b.get("points", []) if ceiling else ():
        if p["concurrency"] >= workers:
            bound(goals, f"(b) throughput at c={p['concurrency']} / (a) {workers}-thread ceiling",
                  p["throughput_rps"] / ceiling, ">= 0.95", nd=3)
    base_p99 = (_run_point(b, workers) or {}).get("latency_p99_s")
    top = max((p["concurrency"] for p in b.get("points", [])), default=None)
    for name, p in ((f"c={top}", _run_point(b, top) if top else None), ("3x overload", b.get("overload"))):
        if not p:
            continue
        bound(goals, f"(b) {name}: 503 reject latency p99 (ms)", p.get("reject_p99_s"), "< 10", nd=1, scale=1000)
        adm = p.get("latency_p99_s")
        if adm is not None and base_p99:
            bound(goals, f"(b) {name}: admitted p99 / p99 at c={workers}", adm / base_p99, "<= 2")
        other = p["errors"] + p["timeouts"]
        add_goal(goals, f"(b) {name}: errors + timeouts (not 503)", str(other), "0", other == 0)
    if b and th:
        for name, x, y, target in (
                ("(b) p50 latency at c=1 minus (a) in-process (ms)", (_run_point(b, 1) or {}).get("latency_p50_s"),
                 th["c1"]["latency_p50_s"], "<= 10"),
                ("(b) stream TTFA p50 minus the engine's own first chunk (ms)",
                 (b.get("ttfa") or {}).get("ttfa_p50_s"), th.get("first_chunk_p50_s"), "<= 5")):
            if x is not None and y is not None:
                bound(goals, name, x - y, target, nd=1, scale=1000)
    if d := drift(b.get("ttfa_series") or []):
        first, last = d
        add_goal(goals, f"(b) TTFA drift: median of last vs first streams (of {len(b['ttfa_series'])}), ms",
                 f"{last * 1000:.1f} vs {first * 1000:.1f}", "within 10% or 5 ms",
                 abs(last - first) <= max(0.005, 0.10 * first))
    if d := drift((th or {}).get("first_chunk_s") or []):
        add_goal(goals, "(a) engine first chunk drift: last vs first streams, ms",
                 f"{d[1] * 1000:.1f} vs {d[0] * 1000:.1f}", "info", None)
    mem = b.get("memory")
    if mem and mem.get("growth") is not None:
        mib = [fmt(mem[k] or None, 0, PER_MB) for k in ("rss_before", "rss_after")]
        add_goal(goals, f"(b) RSS growth over {mem['requests']} requests after warm-up",
                 f"{mem['growth'] * 100:+.2f}% ({mib[0]} -> {mib[1]} MiB)", "<= +2%", mem["growth"] <= 0.02)
    return goals


def run_markdown(r: dict) -> str:
    cfg = r["config"]
    lines = [
        "# Benchmark results", "",
        (f"Run {r['started']}, {r['cores']} cores, {r['elapsed_s'] / 60:.1f} min; model `{r['model_dir']}` "
        f"(tiny random-weight CosyVoice2); text: \"{r['text']}\". "
        f"{'QUICK SMOKE RUN: the numbers mean nothing. ' if cfg.get('quick') else ''}"
        f"Points: {cfg['point_s']:g} s measured after {cfg['warmup_s']:g} s warm-up; overload {cfg['overload_s']:g} s; "
         f"cosyserve pool: {_pool_text(cfg)}. Times in ms, RSS in MiB. "
         f"Load average at start {r['loadavg_start'][0]:.2f}, at end {r['loadavg_end'][0]:.2f} "
         "(anything else running skews the numbers)."), "",
    ]
    th = r.get("ceiling_threads")
    if th:
        setups = [("1 thread", th["c1"]), (f"{th['workers']} threads, one engine each", th["cw"])]
        lines += ["## (a) Ceilings: the engine in-process, no HTTP", "", *table(
            ["setup", "throughput (req/s)", "p50", "p99"],
            [[label, f"{s['throughput_rps']:.2f}", ms(s["latency_p50_s"], 1), ms(s["latency_p99_s"], 1)]
             for label, s in setups]),
            "", f"Engine load {th['load_s'] * 1000:.0f} ms (first, with imports: {th['load_s_first']:.1f} s); "
            f"own first streamed chunk p50 {ms(th['first_chunk_p50_s'], 1)} ms.", ""]
    rows = [(sys_["label"], name, p) for sys_ in r["systems"].values() for name, p in
            [*((f"c={p['concurrency']}", p) for p in sys_["points"]),
             *((f"open {o['rate_rps']:.2f}/s", o) for o in filter(None, [sys_.get("overload")]))]]
    lines += ["## HTTP systems", "", *table(
        ["system", "load", "req/s", "p50", "p95", "p99", "TTFA p50", "503s", "503 p99", "errors", "timeouts",
         "peak RSS"],
        [[label, name, f"{p['throughput_rps']:.2f}", *(ms(p[k], 1) for k in ("latency_p50_s", "latency_p95_s",
          "latency_p99_s", "ttfa_p50_s")), p["rejected"], ms(p["reject_p99_s"], 1), p["errors"], p["timeouts"],
          fmt(p.get("peak_rss") or None, 0, PER_MB)] for label, name, p in rows])]
    for sys_ in r["systems"].values():
        if sys_.get("failed"):
            lines.append(f"\n**{sys_['label']} failed:** `{sys_['failed'][:300]}`")
        if sys_.get("rss_limit_hit"):
            lines.append(f"\n**{sys_['label']} was killed at the RSS limit ({r['config']['max_rss_gb']:g} GiB)**"
                         f"{'; points after that were skipped' if sys_.get('stopped') else ''}.")
    lines += ["", "## Goals", "", *goals_table(r.get("goals", []))]
    return "\n".join(lines) + "\n"


# admission ---------------------------------------------------------------------------------------

SETTLE_GOAL_S = 10.0
COUNTS = ("requests", "ok", "rejected", "timeouts", "errors")  # summed over rounds; the rest: the median round's


def backoff(seconds: float | None) -> str:
    """What a 503 cost a closed-loop client."""
    return "the pause its Retry-After names" if seconds is None else f"{seconds:g} s"


def settle_times(step: dict) -> list[float | None]:
    """Seconds from each load change (0.5x -> 3x, 3x -> 0.5x) to the limit's last change in that phase.

    0 when the limit did not move; None when the series has no limit (a fixed server reports its
    constant capacity, so it shows 0).
    """
    series = [(p["t"], p.get("limit")) for p in step.get("series", []) if p.get("limit") is not None]
    if not series:
        return [None, None]
    offset, length = step.get("poll_offset_s", 0.0), step["step_s"]
    out: list[float | None] = []
    for boundary in (offset + length, offset + 2 * length):
        before = [v for t, v in series if t < boundary]
        last = before[-1] if before else series[0][1]
        settled = 0.0
        for t, v in series:
            if boundary <= t < boundary + length:
                if v != last:
                    settled = t - boundary
                last = v
        out.append(round(settled, 1))
    return out


def per_point(measured: list[dict], key: str) -> list[dict]:
    """One entry per ``key`` (concurrency, or open-loop factor) from rounds of the same point, in first-seen
    order: the round of median throughput (its latencies, its limit; the lower middle of an even count), the
    counts summed over all rounds, every round's throughput in ``rounds`` (one round: as measured)."""
    groups: dict[Any, list[dict]] = {}
    for m in measured:
        groups.setdefault(m[key], []).append(m)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        ranked = sorted(group, key=lambda m: m["throughput_rps"])
        merged = dict(ranked[(len(ranked) - 1) // 2])
        for count in COUNTS:
            merged[count] = sum(m.get(count, 0) for m in group)
        merged["rounds"] = [m["throughput_rps"] for m in group]
        clients = [m.get("concurrency") for m in group]
        if key != "concurrency" and len(set(clients)) > 1:
            merged["concurrencies"] = clients  # the best closed point re-run: it can differ from round to round
        out.append(merged)
    return out


def best_closed(points: list[dict]) -> dict:
    """The closed-loop point of the best throughput (of the points' median rounds)."""
    return max(points, key=lambda p: p["throughput_rps"])


def paired_ratios(opened: list[dict], refs: list[dict]) -> list[dict]:
    """Per open-loop factor: each round's goodput over the best closed-loop point measured just before it
    (the k-th open phase at a factor with the k-th reference at that factor), and their median."""
    out = []
    for factor in dict.fromkeys(o["factor"] for o in opened):
        runs = [o["throughput_rps"] for o in opened if o["factor"] == factor]
        before = [r["throughput_rps"] for r in refs if r["factor"] == factor]
        ratios = [round(x / ref, 4) for x, ref in zip(runs, before, strict=False) if ref > 0]
        if ratios:
            out.append({"factor": factor, "ratios": ratios, "median": statistics.median(ratios)})
    return out


def spread(p: dict) -> str:
    """``" (min-max of n)"`` when the point was measured in rounds."""
    rounds = p.get("rounds") or []
    return f" ({min(rounds):.2f}-{max(rounds):.2f} of {len(rounds)})" if len(rounds) > 1 else ""


def knee(points: list[dict]) -> dict | None:
    """The closed-loop point with the fewest clients reaching 0.9x the best throughput."""
    if not points:
        return None
    best = best_closed(points)["throughput_rps"]
    return min((p for p in points if p["throughput_rps"] >= 0.9 * best), key=lambda p: p["concurrency"])


def admission_goals(r: dict) -> list[dict]:
    goals: list[dict] = []
    systems = r.get("systems", {})
    for key, sys_ in systems.items():
        if sys_.get("failed") or not sys_.get("points"):
            continue
        graded = key == "defaults"  # the issue's goals are for the defaults; the others are shown for comparison
        check = partial(bound, goals, graded=graded)
        k, best = knee(sys_["points"]), best_closed(sys_["points"])["throughput_rps"]
        add_goal(goals, f"[{key}] knee (fewest clients at >= 0.9x the best {best:.2f} req/s)",
                 f"c={k['concurrency']}, p99 {ms(k['latency_p99_s'])} ms", "info", None)
        for o in sys_.get("open", []):
            name = f"[{key}] open loop {o['factor']:g}x"
            if o["latency_p99_s"] is not None and k["latency_p99_s"]:
                check(f"{name}: admitted p99 / p99 at the knee", o["latency_p99_s"] / k["latency_p99_s"], "<= 2")
            check(f"{name}: throughput / best closed loop", o["throughput_rps"] / best if best else 0.0, ">= 0.95")
            pair = next((x for x in sys_.get("paired") or [] if x["factor"] == o["factor"]), None)
            if pair:
                rounds = " / ".join(f"{x:.2f}" for x in pair["ratios"])
                check(f"{name}: throughput / the best closed point re-measured just before it (median of "
                      f"rounds: {rounds})", pair["median"], ">= 0.95")
            rej, bad = o.get("reject_p99_s"), o["errors"] + o["timeouts"]
            add_goal(goals, f"{name}: 503 p99 (ms)", ms(rej), "< 10", (rej is None or rej < 0.010) if graded else None)
            add_goal(goals, f"{name}: errors + timeouts", str(bad), "0", bad == 0 if graded else None)
        p8 = next((p for p in sys_["points"] if p["concurrency"] == 8), None)
        if p8 and p8["latency_p50_s"]:
            check(f"[{key}] c=8: p99 / p50 (starvation)", p8["latency_p99_s"] / p8["latency_p50_s"], "<= 2")
        rej = sys_.get("server_503") or {}
        if rej.get("count"):  # the client's clock adds its own scheduling on the same 2 cores as the server
            check(f"[{key}] 503 p99 as the server timed it, whole run (ms)", rej["p99_ms"], "< 10", nd=1)
        settle = (sys_.get("step") or {}).get("settle_s") or []
        if settle and all(s is not None for s in settle):
            check(f"[{key}] step 0.5x -> 3x -> 0.5x: the limit settles within (s)", max(settle),
                  f"<= {SETTLE_GOAL_S:g}", shown=" / ".join(f"{s:g}" for s in settle))
    fixed = [s for k, s in systems.items() if k != "defaults" and s.get("points")]
    for p in (systems.get("defaults") or {}).get("points", []):
        rivals = [q["throughput_rps"] for s in fixed for q in s["points"] if q["concurrency"] == p["concurrency"]]
        if rivals and max(rivals) > 0:
            bound(goals, f"[defaults] c={p['concurrency']}: throughput / best fixed", p["throughput_rps"] / max(rivals),
                  ">= 0.95")
    return goals


def _clients(p: dict) -> str:
    """A point's clients: ``8/4/8`` where its rounds ran different ones (the latencies are the median round's,
    the counts all rounds')."""
    return "/".join(str(c) for c in p["concurrencies"]) if p.get("concurrencies") else str(p["concurrency"])


def admission_rows(sys_: dict) -> list[tuple[str, dict, Any]]:
    rows: list[tuple[str, dict, Any]] = [(f"closed c={p['concurrency']}", p, p.get("limit_last"))
                                         for p in sys_.get("points", [])]
    rows += [(f"closed c={_clients(p)} again, before {p['factor']:g}x", p, None) for p in sys_.get("refs", [])]
    rows += [(f"open {o['factor']:g}x ({o['rate_rps']:.2f}/s)", o, None) for o in sys_.get("open", [])]
    step = sys_.get("step") or {}
    names = ("step 0.5x", "step 3x", "step 0.5x again")
    rows += [(f"{names[i]} ({p['rate_rps']:.2f}/s)", p, None) for i, p in enumerate(step.get("phases", []))]
    return rows


def admission_markdown(r: dict) -> str:
    cfg = r["config"]
    lines = [
        "# Overload with the defaults: admission benchmark", "",
        (f"Run {r['started']}, {r['cores']} cores, model `{r['model']}`; every request `POST /v1/tts` streamed "
         f"16-bit PCM of \"{r['text']}\". {'QUICK SMOKE RUN: the numbers mean nothing. ' if cfg.get('quick') else ''}"
         f"Closed loop {cfg['point_s']:g} s measured after {cfg['warmup_s']:g} s (a 503 costs its client "
         f"{backoff(cfg.get('reject_backoff_s'))}); open loop {cfg['overload_s']:g} s per rate (goodput: the work "
         "done while the arrivals lasted); "
         + (f"step phases {cfg['step_s']:g} s. " if cfg["step_s"] > 0 else "no step test. ")
         + (f"Every point measured in {cfg['rounds']} rounds: each row is its median round, the req/s range in "
            "brackets, the counts summed. " if cfg.get("rounds", 1) > 1 else "")
         + ("The \"again\" rows: the best closed-loop point re-run just before each open-loop rate, which is "
            "graded against it too. " if cfg.get("paired") else "")
         + (f"Servers at nice {cfg['server_nice']}. " if cfg.get("server_nice", 0) > 0 else "")
         + (f"The load generator ran in {r['load_generator']}. " if r.get("load_generator") else "")
         + ("The servers ran side by side, phase by phase in turn. " if not cfg.get("sequential") else "")
         + f"Load average at start {r['loadavg_start'][0]:.2f}, at end {r['loadavg_end'][0]:.2f}. Latencies in ms "
         "(send to last byte, admitted requests); goodput in requests and audio seconds per wall second. Method: "
         "docs/benchmarks/README.md, \"Overload with the defaults\"."),
        "",
    ]
    for key, sys_ in r["systems"].items():
        lines += [f"## {key}: pool {sys_.get('pool') or '(no settings)'}", ""]
        if sys_.get("admission_log"):
            lines += [f"Startup log: `admission: {sys_['admission_log']}`", ""]
        rej = sys_.get("server_503") or {}
        if rej.get("count"):
            lines += [f"503s as the server timed them (access log, the whole run): {rej['count']}, p50 "
                      f"{rej['p50_ms']:.1f} ms, p99 {rej['p99_ms']:.1f} ms.", ""]
        if sys_.get("failed"):
            lines += [f"**failed:** `{sys_['failed'][:300]}`", ""]
            continue
        lines += table(["load", "req/s", "audio-s/s", "p50", "p99", "TTFA p50", "503s", "503 p99", "errors", "timeouts",
                        "limit"],
                       [[name, f"{p['throughput_rps']:.2f}{spread(p)}", f"{p.get('audio_per_s', 0.0):.1f}",
                         ms(p["latency_p50_s"]), ms(p["latency_p99_s"]), ms(p["ttfa_p50_s"]), p["rejected"],
                         ms(p["reject_p99_s"]), p["errors"], p["timeouts"], "-" if limit is None else f"{limit:g}"]
                        for name, p, limit in admission_rows(sys_)])
        step = sys_.get("step") or {}
        series = step.get("series") or []
        if series:
            every = max(1, len(series) // 40)
            pts = ", ".join(f"{p['t']:.0f}s:{p['limit']:g}" for p in series[::every] if p.get("limit") is not None)
            lines += ["", f"Step test, admission limit over time (s since the first phase began at "
                          f"{step.get('poll_offset_s', 0):.1f} s; phases change every {step['step_s']:g} s; "
                          f"settled {step.get('settle_s')} s after each change): {pts}"]
        lines.append("")
    lines += ["## Goals", "", *goals_table(r.get("goals", []))]
    return "\n".join(lines) + "\n"


# priority ----------------------------------------------------------------------------------------

LATENCY_RATIO_MAX = 1.1
GOODPUT_RATIO_MIN = 0.95
PRIORITY_PHASES = {"A": "interactive alone", "B": "interactive + bulk backlog", "A2": "interactive alone again",
                   "C": "bulk backlog alone"}


def backlog_summary(results: list[Result], window: tuple[float, float] | None = None) -> dict[str, Any]:
    """The bulk backlog: counts, completion time (first submit to last done), goodput (audio s per wall s over
    ``window``, phase B's, or else over the completion time), the longest wait (its time to first audio: what
    the class timeout bounds)."""
    ok = [r for r in results if r.kind == "ok"]
    starts = [r.start for r in results]
    ends = [r.start + r.latency_s for r in results]
    completion = max(ends) - min(starts) if results else 0.0
    if window is not None:  # a queued request computes nothing: its audio is spread over first audio -> end
        computing = [replace(r, start=r.start + r.ttfa_s, latency_s=r.latency_s - r.ttfa_s) if r.ttfa_s else r
                     for r in ok]
        goodput = work_in_window(computing, *window, weight=lambda r: r.audio_s)
    else:
        goodput = sum(r.audio_s for r in ok) / completion if completion > 0 else 0.0
    ttfa = [r.ttfa_s for r in ok if r.ttfa_s is not None]
    lat = [r.latency_s for r in ok]
    return {
        "requests": len(results), "ok": len(ok), "rejected": sum(r.kind == "rejected" for r in results),
        "failed": sum(r.kind in ("error", "timeout") for r in results),
        "completion_s": completion, "audio_s": sum(r.audio_s for r in ok), "audio_per_s": goodput,
        "ttfa_p50_s": percentile(ttfa, 50), "latency_p50_s": percentile(lat, 50),
        "latency_p99_s": percentile(lat, 99), "max_wait_s": max(ttfa) if ttfa else None,
    }


def _vs_alone(name: str, beside: float | None, a: float | None, a2: float | None, target: str, margin: float,
              extra: str = "", said_before: str = "") -> dict[str, Any]:
    """``beside`` over the alone reference (the geometric mean of A and A2, or the one measured) against ``target``
    (a bound). Where A and A2 differ by more than ``margin`` it passes if it holds against each of them, fails if
    against neither, and is not resolvable here if against one only. ``extra``: more noise after A2/A."""
    op, limit = target.split(" ", 1)
    both = a is not None and a2 is not None and a > 0 and a2 > 0
    alone, drift = ((a * a2) ** 0.5, a2 / a) if both else ((a if a2 is None else a2), None)  # type: ignore[operator]
    r = ratio(beside, alone)
    noise = ("" if drift is None else f"A2/A {drift:.3f}") + extra
    ok = None if r is None else BOUNDS[op](r, float(limit))
    if ok is not None and drift is not None and max(drift, 1 / drift) > margin:
        vs_a, vs_a2 = beside / a, beside / a2  # type: ignore[operator]
        ok = {2: True, 0: False}.get(sum(BOUNDS[op](x, float(limit)) for x in (vs_a, vs_a2)))
        said = {True: "met against each", False: "missed against each", None: "not resolvable here"}[ok]
        noise += f"{said_before} past the margin: {said} (B/A {vs_a:.3f}, B/A2 {vs_a2:.3f})"
    return goal(name, r, target, ok, noise=noise)


def priority_goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, graded on the phases measured (a goal without its numbers is ``None``: not met)."""
    phases = results.get("phases", {})
    alone, beside = phases.get("A", {}).get("interactive", {}), phases.get("B", {}).get("interactive", {})
    again = phases.get("A2", {}).get("interactive", {})
    bulk_b, bulk_c = phases.get("B", {}).get("bulk", {}), phases.get("C", {}).get("bulk", {})
    goals = [_vs_alone(f"{name} beside the backlog / alone", beside.get(key), alone.get(key), again.get(key),
                       f"<= {LATENCY_RATIO_MAX}", LATENCY_RATIO_MAX)
             for key, name in (("latency_p99_s", "interactive p99 latency"), ("ttfa_p99_s", "interactive p99 TTFA"))]
    # the best closed-loop point, re-run on both sides of B: the knee's loop alone in A and in A2 (the sweep's
    # 20 s points are a moment of a host that drifts; its best is shown beside, not graded)
    total = None if not beside or not bulk_b else beside.get("audio_per_s", 0.0) + bulk_b.get("audio_per_s", 0.0)
    sweep = ratio(total, results.get("knee", {}).get("best_audio_per_s"))
    goals.append(_vs_alone("total goodput beside the backlog / the knee's loop alone (A, A2)", total,
                           alone.get("audio_per_s"), again.get("audio_per_s"), f">= {GOODPUT_RATIO_MIN}",
                           2 - GOODPUT_RATIO_MIN, "" if sweep is None else f"; / the sweep's best point {sweep:.3f}",
                           "; A2/A"))
    timeout = results.get("bulk_timeout_s")
    for phase, bulk in (("B", bulk_b), ("C", bulk_c)):
        if not bulk:
            goals.append(goal(f"backlog ({phase}) 503s and failures", None, "0 and 0", None))
            continue
        goals.append(goal(f"backlog ({phase}) 503s and failures", f"{bulk['rejected']} and {bulk['failed']}",
                          "0 and 0", bulk["requests"] > 0 and bulk["ok"] == bulk["requests"]))
        wait = bulk.get("max_wait_s")
        goals.append(goal(f"backlog ({phase}) longest wait, s", wait, f"<= {timeout} (class timeout)",
                          None if wait is None or timeout is None else wait <= timeout))
    return goals


def _priority_fmt(v: Any, unit: str = "") -> str:
    return ms(v) if unit == "ms" else fmt(v) if isinstance(v, float) or v is None else str(v)


ROWS: tuple[tuple[str, str, str, str], ...] = (
    # (label, class, key, unit)
    ("interactive goodput, audio s/s", "interactive", "audio_per_s", ""),
    ("bulk goodput, audio s/s", "bulk", "audio_per_s", ""),
    ("interactive TTFA p50, ms", "interactive", "ttfa_p50_s", "ms"),
    ("interactive TTFA p99, ms", "interactive", "ttfa_p99_s", "ms"),
    ("interactive latency p50, ms", "interactive", "latency_p50_s", "ms"),
    ("interactive latency p99, ms", "interactive", "latency_p99_s", "ms"),
    ("interactive ok", "interactive", "ok", ""),
    ("interactive 503s", "interactive", "rejected", ""),
    ("interactive failures", "interactive", "failed", ""),
    ("bulk ok / submitted", "bulk", "ok_of", ""),
    ("bulk completion, s", "bulk", "completion_s", ""),
    ("bulk 503s", "bulk", "rejected", ""),
    ("bulk failures", "bulk", "failed", ""),
    ("bulk longest wait, s", "bulk", "max_wait_s", ""),
)


def _priority_cell(phase: dict[str, Any], cls: str, key: str, unit: str) -> str:
    part = phase.get(cls)
    if not part:
        return ""
    if key == "ok_of":
        return f"{part['ok']} / {part['requests']}"
    if key == "failed" and cls == "interactive":
        return _priority_fmt(part.get("errors", 0) + part.get("timeouts", 0))
    return _priority_fmt(part.get(key), unit)


def limit_readings(limits: list[float]) -> dict[str, Any] | None:
    """The admission limit over one phase (``/metrics`` read every 0.5 s): its mean and each value's share."""
    if not limits:
        return None
    shares = {f"{v:g}": round(limits.count(v) / len(limits), 3) for v in sorted(set(limits))}
    return {"mean": round(sum(limits) / len(limits), 3), "readings": len(limits), "shares": shares}


def _limit_cell(phase: dict[str, Any]) -> str:
    lim = phase.get("limit")
    if not lim:
        return ""
    parts = ", ".join(f"{v}: {share * 100:.0f} %" for v, share in lim["shares"].items())
    return f"{lim['mean']:.2f} ({parts})"


def priority_table(results: dict[str, Any]) -> str:
    """Side by side per phase, as a markdown table."""
    phases = [results.get("phases", {}).get(k, {}) for k in PRIORITY_PHASES]
    rows = [[label, *(_priority_cell(phase, cls, key, unit) for phase in phases)] for label, cls, key, unit in ROWS]
    if any(phase.get("limit") for phase in phases):
        rows.append(["admission limit, mean (share of readings)", *map(_limit_cell, phases)])
    return "\n".join(table(["", *(f"{k}: {v}" for k, v in PRIORITY_PHASES.items())], rows))


def priority_markdown(results: dict[str, Any]) -> str:
    knee = results.get("knee", {})
    out = [
        "# Live and bulk on one server (bench.priority)", "",
        (f"Model {results.get('model')}, {results.get('cores')} cores; closed loop of "
        f"{results.get('clients', knee.get('concurrency'))} interactive clients (the knee, the admission limit "
        f"settled on: {_priority_fmt(knee.get('limit'))}; the sweep {knee.get('swept')}: best "
        f"{_priority_fmt(knee.get('best_audio_per_s'))} audio s/s at c={knee.get('best_concurrency')}), "
        f"{results.get('phase_s')} s per phase; backlog of {results.get('backlog')} bulk requests submitted at once; "
        f"bulk class timeout {results.get('bulk_timeout_s')} s."), "",
        priority_table(results), "", "## Goals", "", *goals_table(results.get("goals", []), tail=("noise",)),
    ]
    return "\n".join(out) + "\n"


# abuse -------------------------------------------------------------------------------------------

# the phases graded on the polite client and the server's RSS (huge-chunked: not in the issue's list, graded alike)
NORMAL_GOALS = ("dribblers", "slow-heads", "non-readers", "ws-idle", "ws-chatty", "giant-fields", "huge-body",
                "huge-chunked")
GOODPUT_MIN, P99_MAX, RSS_GROWTH_MAX = 0.9, 1.5, 200 * MB
LONG_GOODPUT_MIN, LONG_P99_MAX, WS_OVER_HTTP_MAX = 0.8, 2.0, 1.3  # issue 47: beside one long job
GIANT_ANSWER_MAX_S, HUGE_SENT_MAX = 0.1, MB
HEAD_CLOSED_MAX_S = 10.0 + 2.0  # issue 47: a slow head closed within server.header_timeout_s (10), + 2 s of slack
ACCESS = re.compile(r"cosyserve\.access: \S+ (\S+) (\S+) (\d{3}) ([0-9.]+)ms.*?( aborted)?$")
HELD = re.compile(r" held=([0-9.]+)ms")  # an error answer held by the server's refusal pacer
WS_END = re.compile(r"cosyserve\.ws: \S+ WS \S+ .* ([0-9.]+)s close=(\S+)")


def server_log(text: str) -> dict[str, dict[str, Any]]:
    """The server's own account of a phase, from its log: each ``METHOD path status`` (``aborted``: no complete
    response) with its count and times as the server measured them, and each WebSocket session's close."""
    times: dict[str, list[float]] = {}
    for line in text.splitlines():
        if m := ACCESS.search(line):
            key, value = f"{m[1]} {m[2]} {m[3]}{' aborted' if m[5] else ''}", float(m[4])
        elif m := WS_END.search(line):
            key, value = f"WS close={m[2]}", float(m[1]) * 1000
        else:
            continue
        times.setdefault(key, []).append(value)
    return {k: {"count": len(v), "p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99), "max_ms": max(v)}
            for k, v in sorted(times.items())}


def server_refusal_p99_ms(text: str, held: bool = False) -> float | None:
    """p99 of the server's time for its 4xx answers (the access log's), without the time the refusal pacer held
    them (``held``: p99 of that hold instead)."""
    values = []
    for line in text.splitlines():
        if (m := ACCESS.search(line)) and m[3][0] == "4":
            h = HELD.search(line)
            hold = float(h[1]) if h else 0.0
            values.append(hold if held else max(0.0, float(m[4]) - hold))
    return percentile(values, 99)


def server_log_text(log: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{k} x{v['count']} (p50 {v['p50_ms']:.0f} ms, max {v['max_ms']:.0f} ms)"
                     for k, v in log.items()) or "nothing"


def reference(phases: list[dict]) -> dict[str, float | None]:
    """The polite client alone: the mean of the alone phases' goodput and p99 (first and last run)."""
    alone = [p["polite"] for p in phases if p["adversary"] is None]
    rps = [a["throughput_rps"] for a in alone]
    p99 = [a["latency_p99_s"] for a in alone if a["latency_p99_s"] is not None]
    return {"throughput_rps": statistics.fmean(rps) if rps else None,
            "latency_p99_s": statistics.fmean(p99) if p99 else None, "runs": len(alone)}


def storm_rates(tally: dict, lo: float, hi: float) -> dict[str, float]:
    """A storm's 200s per second (each by its overlap with [lo, hi], as the closed loop counts) and 503s per second."""
    ok = [Result(start, 200, latency, None, 0, "ok") for start, latency in tally.get("ok", [])]
    rejected = sum(n for t, n in tally.get("rejected", {}).items() if lo <= float(t) <= hi)
    return {"goodput_rps": work_in_window(ok, lo, hi), "rejected_per_s": rejected / (hi - lo) if hi > lo else 0.0}


def answers_text(tally: dict | None) -> str:
    """The adversary's answers: each kind with its count, the time to them, the bytes sent before them."""
    if not tally:
        return "-"
    kinds = sorted(tally["answers"].items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{k} x{n}" for k, n in kinds) or "no answer"
    times = tally.get("answer_s") or []
    if times:
        which = "the non-200s " if tally["kind"].startswith("storm") else ""  # a storm's 200s: in ``ok``
        text += f"; {which}after p50 {ms(percentile(times, 50), 0, ' ms')}, max {ms(max(times), 0, ' ms')}"
    sent = tally.get("sent_bytes") or []
    if sent and tally["kind"] in ("dribble", "slow-head", "huge", "huge-chunked"):
        text += f"; sent max {sent_text(max(sent))}"
    if tally.get("audio_wall_s"):
        text += (f"; {tally['audio_s']:.1f} audio-s in {tally['audio_wall_s']:.1f} s: "
                 f"{tally['audio_s'] / tally['audio_wall_s']:.2f} audio-s per s")
    got = tally.get("received_bytes") or []
    if got:
        text += f"; unread audio queued max {sent_text(max(got))}"
    return text


def megabytes(v: float | None) -> str:
    return fmt(v, 0, PER_MB, " MB")


def sent_text(n: int) -> str:
    return f"{n} B" if n < 10_000 else f"{n / 1024:.0f} KiB" if n < MB else f"{n / MB:.1f} MiB"


def statuses_text(statuses: dict[str, int]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in sorted(statuses.items())) or "none"


ABUSE_COLUMNS = ["phase", "polite req/s (x alone)", "p50", "p99 (x alone)", "polite non-200 (whole phase)",
                 "server RSS start -> peak", "CPU server / bench / adversary", "adversary's answers",
                 "the server's log"]


def abuse_row(p: dict, ref: dict) -> list[str]:
    """One phase's row (printed as it ends, and in abuse.md): the polite client, the server's RSS and CPU, the
    adversary's answers, the server's log."""
    s = p["polite"]
    adv = f"{p['adversary']} x{p['clients']}: {answers_text(p.get('tally'))}" if p["adversary"] else "-"
    if p.get("storm"):
        st = p["storm"]
        adv = (f"storm of {p['clients']}: {st['goodput_rps']:.2f} 200s/s, {st['rejected_per_s']:.0f} 503s/s, "
               f"with the polite client {st['total_rps']:.2f} 200s/s; " + adv)
    return [p["name"], f"{s['throughput_rps']:.2f} ({fmt(ratio(s['throughput_rps'], ref['throughput_rps']))})",
            ms(s["latency_p50_s"], 0, ' ms'),
            f"{ms(s['latency_p99_s'], 0, ' ms')} ({fmt(ratio(s['latency_p99_s'], ref['latency_p99_s']))})",
            statuses_text(p["polite_statuses"]), f"{megabytes(p['rss_start'])} -> {megabytes(p['rss_peak'])}",
            f"{p['cpu']['server']:.2f} / {p['cpu']['bench']:.2f} / {p['cpu']['adversary']:.2f}", adv,
            server_log_text(p.get("server_log") or {})]


def abuse_goals(phases: list[dict]) -> list[dict]:
    """The issue's goals per phase (see docs/benchmarks/README.md); ``pass`` None where nothing was measured."""
    ref, goals = reference(phases), []
    for p in phases:
        name, s, tally = p["name"], p["polite"], p.get("tally") or {}
        add, check = partial(add_goal, goals, phase=name), partial(bound, goals, phase=name)
        if name in NORMAL_GOALS:
            check("polite goodput vs alone", ratio(s["throughput_rps"], ref["throughput_rps"]), f">= {GOODPUT_MIN}")
            if not s["ok"]:  # not one answer in the window: as slow as it gets
                add("polite p99 vs alone", "no 200 in the window", f"<= {P99_MAX}", False)
            else:
                check("polite p99 vs alone", ratio(s["latency_p99_s"], ref["latency_p99_s"]), f"<= {P99_MAX}")
            fives = sum(n for k, n in p["polite_statuses"].items() if k.startswith("5"))
            add("polite 5xx answers", str(fives), "0", fives == 0)
            growth = p["rss_peak"] - p["rss_start"] if p["rss_peak"] and p["rss_start"] else None
            add("server RSS growth (peak - phase start)", megabytes(growth), f"< {megabytes(RSS_GROWTH_MAX)}",
                None if growth is None else growth < RSS_GROWTH_MAX)
        if name == "giant-fields" and tally:
            server, held = p.get("server_4xx_p99_ms"), p.get("server_4xx_held_p99_ms")
            add("every giant field refused (4xx)", statuses_text(tally["answers"]), "4xx only",
                all(k[:1] == "4" for k in tally["answers"]) if tally["answers"] else None)
            add("4xx answer time p99, as the server timed it (without the pacer's hold)", fmt(server, 0, unit=" ms"),
                f"< {ms(GIANT_ANSWER_MAX_S, 0, ' ms')}", None if server is None else server < GIANT_ANSWER_MAX_S * 1000)
            add("time the refusal pacer held a resent giant field, p99 (server.refusals_per_s)",
                fmt(held, 0, unit=" ms"), "info", None)
            add("giant field answer time p99, as the niced adversary timed it (1 MB upload in)",
                ms(percentile(tally.get("answer_s") or [], 99), 0, " ms"), "info", None)
        if name in ("huge-body", "huge-chunked") and tally:
            sent, graded = max(tally.get("sent_bytes") or [0], default=0), name == "huge-body"
            answered = any(k != "open at end" for k in tally["answers"])
            # huge-chunked: no goal in the issue, the server can only cut it at its upload limit
            add("bytes sent before the answer or close (max)", sent_text(sent),
                f"< {sent_text(HUGE_SENT_MAX)}" if graded else "info (server.max_upload_mb)",
                sent < HUGE_SENT_MAX and answered if graded else None)
        if name == "slow-heads" and tally:
            closed = sum(n for k, n in tally["answers"].items() if k not in ("open at end", "body complete"))
            add("slow heads answered or closed by the server (each client at least once)",
                f"{closed} of {tally['clients']} clients", f">= {tally['clients']}", closed >= tally["clients"])
            longest = max(tally.get("answer_s") or [], default=None)
            check("longest a slow head stayed open before its answer or close (s)", longest,
                  f"<= {HEAD_CLOSED_MAX_S}", nd=1)
        if name in LONG_JOBS:
            check("polite goodput vs alone", ratio(s["throughput_rps"], ref["throughput_rps"]), f">= {LONG_GOODPUT_MIN}")
            check("polite p99 vs alone", ratio(s["latency_p99_s"], ref["latency_p99_s"]), f"<= {LONG_P99_MAX}")
        if p.get("storm"):
            check("all 200s/s (storm + polite) vs polite alone", ratio(p["storm"]["total_rps"], ref["throughput_rps"]),
                  f">= {GOODPUT_MIN}")
    rates = {p["name"]: long_rate(p.get("tally") or {}) for p in phases if p["name"] in LONG_JOBS}
    if len(rates) == 2:
        speed = ratio(rates["http-long"], rates["ws-long"])
        bound(goals, "WS utterance's audio-s per s: HTTP's over the WebSocket's", speed, f"<= {WS_OVER_HTTP_MAX}",
              phase="ws-long, http-long")
    return goals


LONG_JOBS = ("ws-long", "http-long")


def long_rate(tally: dict) -> float | None:
    """A long-job adversary's audio seconds per wall second (None: none finished)."""
    return tally["audio_s"] / tally["audio_wall_s"] if tally.get("audio_wall_s") else None


def abuse_markdown(results: dict) -> str:
    phases, ref = results["phases"], reference(results["phases"])
    lines = [
        "# Abuse suite (`python -m bench serve --scenario abuse`)", "",
        (f"Started {results['started']}; {results['cores']} cores; load average at start "
        f"{results['loadavg_start'][0]:.2f}, at the end {results['loadavg_end'][0]:.2f}; model {results['model']}; "
        f"server: no pool settings (the defaults); {results['phase_s']:g} s per phase after {results['lead_s']:g} s "
        f"for the adversary to settle in; load generator: {results['load_generator']}."), "",
        (f"Alone (reference: the mean of the {ref['runs']} alone phases, first and last): "
         f"{fmt(ref['throughput_rps'])} req/s, p99 {ms(ref['latency_p99_s'], 0, ' ms')}. Goodput: the polite "
         "client's 200s per "
         "second in the window; p99: its latency; in brackets, each over the reference."), "",
        *table(ABUSE_COLUMNS, [abuse_row(p, ref) for p in phases]),
    ]
    if results.get("server_gone_before"):
        lines += ["", (f"The server was gone (exited, or killed past the RSS guard) before phase "
                  f"{results['server_gone_before']}: that phase and the ones after it did not run.")]
    for name, why in (results.get("failed") or {}).items():
        lines += ["", f"Phase {name} failed: {why}"]
    lines += ["", "## Goals", "", *goals_table(results["goals"], lead=("phase",))]
    return "\n".join(lines) + "\n"


# cost --------------------------------------------------------------------------------------------

def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _cases(res: dict, variant: str) -> dict:
    return res.get(variant, {}).get("cases", {})


def stream_goals(results: dict) -> list[str]:
    """Issue 48's goals: streamed vs whole on the server's defaults (flow cache on) and with it off, same run."""
    out = []
    for model, res in results.items():
        for variant in ("defaults", "recompute"):
            cases = _cases(res, variant)
            for c in ("", "-c4"):
                whole, streamed = cases.get(f"long-whole{c}"), cases.get(f"long-stream{c}")
                if whole is None or streamed is None:
                    continue
                cpu = ratio(streamed["cpu_rtf"], whole["cpu_rtf"])
                flow = ratio(*(x["stages_s_per_request"].get("flow", 0) for x in (streamed, whole)))
                graded = variant == "defaults" and model == "full"
                out.append(f"{model} {variant} c={4 if c else 1}: streamed CPU-s per audio-s / whole = {cpu:.2f}x "
                           f"({streamed['cpu_rtf']:.2f} vs {whole['cpu_rtf']:.2f}; goal <= 1.2x"
                           f"{': ' + _met(cpu <= 1.2) if graded else ''}), flow seconds {flow:.2f}x "
                           f"(goal <= 1.5x{': ' + _met(flow <= 1.5) if graded else ''}), first audio "
                           f"{streamed['ttfa_s']:.2f} s, peak RSS {streamed.get('peak_rss_mb', 0):.0f} MB")
        on, off, exact = (_cases(res, v).get("long-stream") for v in ("defaults", "recompute", "exact"))
        if on is not None and off is not None:
            out.append(f"{model}: first audio with the flow cache {on['ttfa_s']:.2f} s vs without "
                       f"{off['ttfa_s']:.2f} s (goal: no later): {_met(on['ttfa_s'] <= off['ttfa_s'] * 1.05)}")
        if on is not None and exact is not None:
            out.append(f"{model}: fp16 caches vs exact fp32: CPU {on['cpu_s_per_request']:.2f} vs "
                       f"{exact['cpu_s_per_request']:.2f} s per stream, peak RSS {on['peak_rss_mb']:.0f} vs "
                       f"{exact['peak_rss_mb']:.0f} MB")
        budget = res.get("defaults", {}).get("flow_cache_budget")
        if budget:
            out.append(f"{model}: flow cache budget {budget['max_mb']:.0f} MB ({budget['runtime']}), peak held "
                       f"{budget['peak_mb']:.0f} MB, streams sent to recompute {budget['recomputed']}")
    return out


def cost_markdown(doc: dict) -> str:
    """Streamed vs whole on the defaults: the cases' table and the goals."""
    host = ", ".join(f"{k} {v}" for k, v in doc["host"].items())
    cmds = " then ".join(f"`{c}`" for c in doc["commands"])
    stages = ("frontend", "llm", "flow", "hift")
    header = ["model", "variant (ran)", "case", "c", "CPU s/req", "wall s", "RTF", "CPU RTF", "TTFA s", "audio s/req",
              "flow frames/req", "first hop frames", *stages, "peak RSS MB"]
    rows = [[model, f"{variant} ({res['ran']})", name, c["concurrency"], f"{c['cpu_s_per_request']:.2f}",
             f"{c['wall_s']:.2f}", f"{c['rtf']:.2f}", f"{c['cpu_rtf']:.2f}", f"{c['ttfa_s']:.2f}",
             f"{c['audio_s_per_request']:.2f}", f"{c['flow_frames_per_request']:.0f}",
             fmt(c.get("first_hop_flow_frames"), 0), *(f"{c['stages_s_per_request'].get(k, 0.0):.2f}" for k in stages),
             fmt(c.get("peak_rss_mb"), 0)]
            for model, by_variant in doc["results"].items() for variant, res in by_variant.items()
            for name, c in res["cases"].items()]
    lines = ["# Streamed vs whole on the server's defaults: the flow cache", "",
             f"Commands: {cmds}. Host: {host}. One torch thread, batched engine path, zero-shot with a 2 s prompt "
             "(50 prompt tokens). `defaults`: the engine settings a server starts with (ONNX Runtime flow, flow cache "
             "on, fp16 caches, budget sized at load); `recompute`: the same with `engine.flow_cache: false`; `exact`: "
             "`engine.flow_cache_precision: fp32`; `bf16`: `engine.dtype: bf16`.", "", *table(header, rows), "",
             "Stage columns: seconds per request, wall time (`llm` runs from start to last token and overlaps flow and "
             "HiFT when streaming; at c=4 each includes waiting for the cores). First hop frames: estimator frames "
             "computed before the first chunk (c=1 streams). Peak RSS: the worker's so far (one variant a process, "
             "cases in the order shown).", "", "## Goals", "", *(f"- {g}" for g in doc["goals"])]
    return "\n".join(lines) + "\n"


# gpu ---------------------------------------------------------------------------------------------

def t2w_row(setting: str, r: dict) -> list[Any]:
    """One row of the token2wav off/on table."""
    errors = f"; errors: {len(r['errors'])}" if r["errors"] else ""
    return [setting, r["concurrency"], r["requests"], ms(r["ttfa_p50_s"]), ms(r["ttfa_p95_s"]),
            fmt(r["audio_s_per_s"]), fmt(r["req_per_s"]), r["flow_rounds"],
            f"{fmt(r['flow_batch_mean'])} / {r['flow_batch_max'] or '-'}", fmt(r["flow_round_ms_mean"], 0),
            f"{fmt(r['llm_step_ms_mean'], 1)} ({fmt(r['llm_batch_mean'], 1)}){errors}"]


def _same(equal: bool) -> str:
    return "equal" if equal else "DIFFERENT"


def _gpu_seeded(s: dict) -> list[str]:
    alone = f"- Seeded, alone vs inside a batch of 3: {_same(s['alone_equals_batched'])} ({s['tokens']} tokens)."
    if s.get("cpu_equals_device") is None:
        return [alone, "- Seeded, CPU vs GPU: not applicable (one device)."]
    first = s["first_difference"] if s["first_difference"] is not None else "-"
    return [alone, f"- Seeded, CPU vs this device: {_same(s['cpu_equals_device'])} ({s['cpu_tokens']} tokens on the "
                   f"CPU; first difference at {first})."]


def _gpu_syncs(sy: dict) -> list[str]:
    px, cf = sy["proxy"], sy.get("cuda_flagged")
    return [f"- CPU proxy (`tests/support/syncs.py`): max {px.get('max')}, mean {px.get('mean')} over "
            f"{px.get('steps')} steps ({px.get('kinds')}).",
            f"- `torch.cuda.set_sync_debug_mode`: max {cf.get('max')}, mean {cf.get('mean')} flagged per step "
            f"over {cf.get('steps')} steps ({cf.get('messages') or 'none'}); plus {sy['by_design']}." if cf
            else "- `torch.cuda.set_sync_debug_mode`: not run (no CUDA device)."]


def _gpu_prefill(pf: dict) -> list[str]:
    rows = [[mode.replace("_", " "), r["prefill_forwards"], fmt(r["gap_ms"], 1), fmt(r["usual_gap_ms"], 1),
             fmt(r["prefill_ms"], 1), r["all_joined_at_once"]] for mode in ("one_by_one", "batched") if (r := pf[mode])]
    return [*table(["prefill", "forwards", "running batch's token gap ms", "usual gap ms", "prefill ms",
                    "all 16 joined at one step"], rows),
            f"\nInputs of {pf['prompt_tokens'][0]}-{pf['prompt_tokens'][1]} tokens ({pf['input_tokens']} in "
            f"all), median of {pf['rounds']} round(s); gap one by one / batched: {fmt(pf['speedup'])}x; the "
            f"joiners' first tokens {'equal' if pf['first_tokens_equal'] else 'DIFFER'} between the modes."]


GPU_PHASES: dict[str, tuple[str | None, str, Callable[[dict], list[str]]]] = {
    # a phase: its heading (None: under the one before), its line when it did not run, its lines when it did
    "parity": ("Parity", "- Batched vs CosyVoice's own: {why}.", lambda p: [
        f"- Batched tokens equal CosyVoice's own `llm.inference` (greedy, fp32): **{p['tokens_equal']} of "
        f"{p['requests']}** requests (tokens {p['tokens']}, batch {p['batch']}); largest log-prob difference where "
        f"a token has any chance: {p['max_logp_diff']:.2e}."]),
    "seeded": (None, "- Seeded: {why}.", _gpu_seeded),
    "drift": (None, "- Half-precision drift: {why}.", lambda d: ["", *table(
        ["LLM dtype", "KV cache", "steps", "max abs log-prob diff (live)", "max rel L2", "top-1 agreement"],
        [[name, r["kv_dtype"], r["steps"], f"{r['max_abs_live']:.3g}", f"{r['max_rel_l2']:.3g}",
          f"{r['top1_agree']:.0%}"] for name, r in d.items()])]),
    "stages": ("One request, per stage (non-streamed, device synchronised at each boundary; median)", "{why}.",
               lambda st: table(["frontend ms", "LLM ms", "flow ms", "HiFT ms", "speech tokens", "audio s"],
                                [[*(ms(st[k]) for k in ("frontend", "llm", "flow", "hift")), f"{st['tokens']:.0f}",
                                  fmt(st["audio_s"])]])),
    "syncs": ("Host syncs per decode step (4 sequences)", "{why}.", _gpu_syncs),
    "prefill": ("Prefill: 16 requests join a running batch of 4 at once", "{why}.", _gpu_prefill),
    "token2wav": ("Batched token2wav: engine.token2wav_batch off vs on", "{why}.", lambda tw: [*table(
        ["token2wav_batch", "c", "reqs", "TTFA p50 ms", "TTFA p95 ms", "audio-s/s", "req/s", "flow rounds",
         "round batch mean / max", "round ms", "LLM step ms (batch)"],
        [t2w_row(setting, r) for setting, rows in tw["runs"].items() for r in rows]),
        "\nStreamed requests, one engine per setting, closed loop; flow rounds only with the setting on."]),
}


def _gpu_phase(doc: dict, name: str) -> list[str]:
    """A phase's heading and lines, or why it did not run (skipped, failed, not run)."""
    heading, missing, lines = GPU_PHASES[name]
    value = doc.get(name)
    ran = isinstance(value, dict) and "skipped" not in value and "failed" not in value
    why = (value or {}).get("skipped") or (value or {}).get("failed") or "not run"
    return ([] if heading is None else ["", f"## {heading}", ""]) + (lines(value) if ran else [missing.format(why=why)])


def gpu_markdown(doc: dict) -> str:
    env, model, v = doc["environment"], doc["model"], doc["environment"].get("versions", {})
    gpu = env.get("name") != "cpu"
    lines = [f"# GPU check: {env.get('name')} ({doc['mode']})", ""]
    if not gpu:
        lines += ["**CPU run** (`--device cpu`): it proves the check works; none of these numbers is a GPU figure.", ""]
    device = (f"{env.get('device')}: {env.get('name')}, compute capability {env.get('capability')}, "
              f"{env.get('memory_gib')} GiB" if gpu else "cpu")
    lines += table(["", ""], [
        ["device", device], *([["CUDA / driver", f"{env.get('cuda')} / {env.get('driver')}"]] if gpu else []),
        ["torch / transformers / numpy", f"{v.get('torch')} / {v.get('transformers')} / {v.get('numpy')}"],
        ["Python", f"{env.get('python')} on {env.get('platform')} ({env.get('cpu_count')} CPUs, "
                   f"{env.get('torch_threads')} torch threads)"],
        ["PYTORCH_CUDA_ALLOC_CONF", env.get("alloc_conf") or "(unset)"],
        ["model", f"{model['dir']} ({'full-size' if model['full_size'] else 'tiny'} random-weight CosyVoice2; built "
                  f"in {model['build_s']:.0f} s, loaded in {model['load_s']:.1f} s)"],
        ["precision", ", ".join(f"{k} {x}" for k, x in model["precision"].items())],
        ["run", f"{doc['started']}, {doc['elapsed_s']} s of a {doc['budget_s']:.0f} s budget"]])
    for name in ("parity", "seeded", "drift", "stages"):
        lines += _gpu_phase(doc, name)
    points = [[pt["concurrency"], f"skipped: {pt['skipped']}", *[""] * 6] if "skipped" in pt else
              [pt["concurrency"], pt["requests"], ms(pt["ttfa_p50_s"]), ms(pt["ttfa_p95_s"]),
               fmt(pt["audio_s_per_wall_s"]), fmt(pt["llm_step_ms_p50"], 1), fmt(pt["llm_mean_batch"], 1),
               pt["error_count"]] for pt in doc.get("streaming", [])]
    lines += ["", "## Streaming (closed loop, sft, one sentence)", "",
              *table(["concurrency", "requests", "TTFA p50 ms", "TTFA p95 ms", "audio s / wall s", "LLM step ms p50",
                      "mean batch", "errors"], points)]
    for name in ("syncs", "prefill", "token2wav"):
        lines += _gpu_phase(doc, name)
    mem = doc.get("gpu_memory")
    lines += ["", "## GPU memory", "",
              f"Peak while streaming: {fmt(mem['peak_allocated_bytes'], 2, PER_GB)} GiB allocated, "
              f"{fmt(mem['peak_reserved_bytes'], 2, PER_GB)} GiB reserved by the allocator "
              f"({fmt(mem['allocated_after_bytes'], 2, PER_GB)} GiB allocated after)." if mem
              else "Not applicable (no CUDA device).",
              "", "Written by `python -m bench gpu` (docs/gpu.md); the JSON it writes beside this report "
              "(default .cache/bench/gpu_check/, not committed) holds every value. Random weights: speed and "
              "memory are the real model's, audio is noise.", ""]
    return "\n".join(lines)
