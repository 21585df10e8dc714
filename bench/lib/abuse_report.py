"""bench/abuse.py's pure parts: the reference, each phase's line, the goals and the markdown report."""

from __future__ import annotations

import re
import statistics
from typing import Any

from bench.lib.load import Result, percentile, work_in_window

MB = 1024 * 1024
# the phases graded on the polite client and the server's RSS (huge-chunked: not in the list, graded alike)
NORMAL_GOALS = ("dribblers", "non-readers", "ws-idle", "ws-chatty", "giant-fields", "huge-body", "huge-chunked")
GOODPUT_MIN, P99_MAX, RSS_GROWTH_MAX = 0.9, 1.5, 200 * MB
GIANT_ANSWER_MAX_S, HUGE_SENT_MAX = 0.1, MB


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def mb(v: float | None) -> str:
    return "-" if v is None else f"{v / MB:.0f} MB"


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


def ratio(value: float | None, ref: float | None) -> float | None:
    return None if value is None or not ref else value / ref


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
        text += f"; {which}after p50 {ms(percentile(times, 50))}, max {ms(max(times))}"
    sent = tally.get("sent_bytes") or []
    if sent and tally["kind"] in ("dribble", "huge", "huge-chunked"):
        text += f"; sent max {sent_text(max(sent))}"
    if tally.get("audio_wall_s"):
        text += (f"; {tally['audio_s']:.1f} audio-s in {tally['audio_wall_s']:.1f} s: "
                 f"{tally['audio_s'] / tally['audio_wall_s']:.2f} audio-s per s")
    got = tally.get("received_bytes") or []
    if got:
        text += f"; unread audio queued max {sent_text(max(got))}"
    return text


def sent_text(n: int) -> str:
    return f"{n} B" if n < 10_000 else f"{n / 1024:.0f} KiB" if n < MB else f"{n / MB:.1f} MiB"


def statuses_text(statuses: dict[str, int]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in sorted(statuses.items())) or "none"


def phase_line(p: dict, ref: dict) -> str:
    """One phase, as printed: the polite client, the server's RSS and CPU, the adversary's answer."""
    s = p["polite"]
    g, q = ratio(s["throughput_rps"], ref["throughput_rps"]), ratio(s["latency_p99_s"], ref["latency_p99_s"])
    out = (f"{p['name']:>13}: polite {s['throughput_rps']:.2f} req/s ({_x(g)}), p50 {ms(s['latency_p50_s'])} "
           f"p99 {ms(s['latency_p99_s'])} ({_x(q)}), non-200 (whole phase) {statuses_text(p['polite_statuses'])}; "
           f"RSS {mb(p['rss_start'])} -> peak {mb(p['rss_peak'])}; CPU cores server {p['cpu']['server']:.2f} "
           f"bench {p['cpu']['bench']:.2f} adversary {p['cpu']['adversary']:.2f}")
    if p.get("storm"):
        st = p["storm"]
        out += (f"\n{'':>15}storm of {p['clients']}: {st['goodput_rps']:.2f} 200s/s, {st['rejected_per_s']:.0f} 503s/s;"
                f" with the polite client {st['total_rps']:.2f} 200s/s ({_x(ratio(st['total_rps'], ref['throughput_rps']))})")
    if p["adversary"] is not None:
        out += f"\n{'':>15}{p['adversary']} x{p['clients']}: {answers_text(p.get('tally'))}"
    if p.get("server_log") is not None:
        out += f"\n{'':>15}server log: {server_log_text(p['server_log'])}"
    return out


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x alone"


def _goal(goals: list, phase: str, goal: str, value: str, target: str, ok: bool | None) -> None:
    goals.append({"phase": phase, "goal": goal, "value": value, "target": target, "pass": ok})


def evaluate_goals(phases: list[dict]) -> list[dict]:
    """The issue's goals per phase (see docs/benchmarks/README.md); ``pass`` None where nothing was measured."""
    ref, goals = reference(phases), []
    for p in phases:
        name, s, tally = p["name"], p["polite"], p.get("tally") or {}
        if name in NORMAL_GOALS:
            g, q = ratio(s["throughput_rps"], ref["throughput_rps"]), ratio(s["latency_p99_s"], ref["latency_p99_s"])
            _goal(goals, name, "polite goodput vs alone", _f(g), f">= {GOODPUT_MIN}", None if g is None else g >= GOODPUT_MIN)
            if not s["ok"]:  # not one answer in the window: as slow as it gets
                _goal(goals, name, "polite p99 vs alone", "no 200 in the window", f"<= {P99_MAX}", False)
            else:
                _goal(goals, name, "polite p99 vs alone", _f(q), f"<= {P99_MAX}", None if q is None else q <= P99_MAX)
            fives = sum(n for k, n in p["polite_statuses"].items() if k.startswith("5"))
            _goal(goals, name, "polite 5xx answers", str(fives), "0", fives == 0)
            growth = p["rss_peak"] - p["rss_start"] if p["rss_peak"] and p["rss_start"] else None
            _goal(goals, name, "server RSS growth (peak - phase start)", mb(growth), f"< {mb(RSS_GROWTH_MAX)}",
                  None if growth is None else growth < RSS_GROWTH_MAX)
        if name == "giant-fields" and tally:
            refused = all(k[:1] == "4" for k in tally["answers"])
            p99 = percentile(tally.get("answer_s") or [], 99)
            server = p.get("server_4xx_p99_ms")
            _goal(goals, name, "every giant field refused (4xx)", statuses_text(tally["answers"]), "4xx only",
                  refused if tally["answers"] else None)
            _goal(goals, name, "4xx answer time p99, as the server timed it (without the pacer's hold)",
                  ms(None if server is None else server / 1000),
                  f"< {ms(GIANT_ANSWER_MAX_S)}", None if server is None else server < GIANT_ANSWER_MAX_S * 1000)
            held = p.get("server_4xx_held_p99_ms")
            _goal(goals, name, "time the refusal pacer held a resent giant field, p99 (server.refusals_per_s)",
                  ms(None if held is None else held / 1000), "info", None)
            _goal(goals, name, "giant field answer time p99, as the niced adversary timed it (1 MB upload in)",
                  ms(p99), "info", None)
        if name == "huge-body" and tally:
            sent = max(tally.get("sent_bytes") or [0], default=0)
            answered = [k for k in tally["answers"] if k != "open at end"]
            _goal(goals, name, "bytes sent before the answer or close (max)", sent_text(sent),
                  f"< {sent_text(HUGE_SENT_MAX)}", sent < HUGE_SENT_MAX and bool(answered))
        if name == "huge-chunked" and tally:  # no goal in the issue: the server can only cut it at its upload limit
            sent = max(tally.get("sent_bytes") or [0], default=0)
            _goal(goals, name, "bytes sent before the answer or close (max)", sent_text(sent),
                  "info (server.max_upload_mb)", None)
        if p.get("storm"):
            t = ratio(p["storm"]["total_rps"], ref["throughput_rps"])
            _goal(goals, name, "all 200s/s (storm + polite) vs polite alone", _f(t), f">= {GOODPUT_MIN}",
                  None if t is None else t >= GOODPUT_MIN)
    return goals


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def markdown(results: dict) -> str:
    phases, ref = results["phases"], reference(results["phases"])
    lines = [
        "# Abuse suite (`python -m bench serve --scenario abuse`)", "",
        (f"Started {results['started']}; {results['cores']} cores; load average at start "
        f"{results['loadavg_start'][0]:.2f}, at the end {results['loadavg_end'][0]:.2f}; model {results['model']}; "
        f"server: no pool settings (the defaults); {results['phase_s']:g} s per phase after {results['lead_s']:g} s "
        f"for the adversary to settle in; load generator: {results['load_generator']}."), "",
        (f"Alone (reference: the mean of the {ref['runs']} alone phases, first and last): "
         f"{_f(ref['throughput_rps'])} req/s, p99 {ms(ref['latency_p99_s'])}. Goodput: the polite client's 200s per "
         "second in the window; p99: its latency; in brackets, each over the reference."), "",
        ("| phase | polite req/s (x alone) | p50 | p99 (x alone) | polite non-200 (whole phase) | server RSS start -> peak | "
        "CPU server / bench / adversary | adversary's answers | the server's log |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        s = p["polite"]
        adv = f"{p['adversary']} x{p['clients']}: {answers_text(p.get('tally'))}" if p["adversary"] else "-"
        if p.get("storm"):
            st = p["storm"]
            adv = (f"storm of {p['clients']}: {st['goodput_rps']:.2f} 200s/s, {st['rejected_per_s']:.0f} 503s/s, "
                   f"with the polite client {st['total_rps']:.2f} 200s/s; " + adv)
        lines.append(
            f"| {p['name']} | {s['throughput_rps']:.2f} ({_f(ratio(s['throughput_rps'], ref['throughput_rps']))}) | "
            f"{ms(s['latency_p50_s'])} | {ms(s['latency_p99_s'])} ({_f(ratio(s['latency_p99_s'], ref['latency_p99_s']))})"
            f" | {statuses_text(p['polite_statuses'])} | {mb(p['rss_start'])} -> {mb(p['rss_peak'])} | "
            f"{p['cpu']['server']:.2f} / {p['cpu']['bench']:.2f} / {p['cpu']['adversary']:.2f} | {adv} | "
            f"{server_log_text(p.get('server_log') or {})} |")
    if results.get("server_gone_before"):
        lines += ["", (f"The server was gone (exited, or killed past the RSS guard) before phase "
                  f"{results['server_gone_before']}: that phase and the ones after it did not run.")]
    for name, why in (results.get("failed") or {}).items():
        lines += ["", f"Phase {name} failed: {why}"]
    lines += ["", "## Goals", "", "| phase | goal | value | target | |", "|---|---|---|---|---|"]
    for g in results["goals"]:
        lines.append(f"| {g['phase']} | {g['goal']} | {g['value']} | {g['target']} | {verdict(g['pass'])} |")
    return "\n".join(lines) + "\n"


def verdict(ok: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[ok]
