"""The admission benchmark's pure parts: when the limit settled, the goals of issue 20, the tables."""

from __future__ import annotations

import statistics
from typing import Any

SETTLE_GOAL_S = 10.0
COUNTS = ("requests", "ok", "rejected", "timeouts", "errors")  # summed over rounds; the rest: the median round's


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def backoff(seconds: float | None) -> str:
    """What a 503 cost a closed-loop client."""
    return "the pause its Retry-After names" if seconds is None else f"{seconds:g} s"


def _goal(goals: list, name: str, value: str, target: str, ok: bool | None) -> None:
    goals.append({"goal": name, "value": value, "target": target, "pass": ok})


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


def best_closed_rps(points: list[dict]) -> float:
    """The best closed-loop throughput (of the points' median rounds)."""
    return best_closed(points)["throughput_rps"]


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
    best = best_closed_rps(points)
    return min((p for p in points if p["throughput_rps"] >= 0.9 * best), key=lambda p: p["concurrency"])


def evaluate_goals(r: dict) -> list[dict]:
    goals: list[dict] = []
    systems = r.get("systems", {})
    for key, sys_ in systems.items():
        if sys_.get("failed") or not sys_.get("points"):
            continue
        graded = key == "defaults"  # the goals are for the defaults; the others are shown for comparison

        def verdict(ok: bool) -> bool | None:
            return ok if graded else None

        k = knee(sys_["points"])
        best = best_closed_rps(sys_["points"])
        k_p99 = k["latency_p99_s"] if k else None
        _goal(goals, f"[{key}] knee (fewest clients at >= 0.9x the best {best:.2f} req/s)",
              f"c={k['concurrency']}, p99 {_ms(k_p99)} ms" if k else "-", "info", None)
        for o in sys_.get("open", []):
            name = f"[{key}] open loop {o['factor']:g}x"
            if o["latency_p99_s"] is not None and k_p99:
                ratio = o["latency_p99_s"] / k_p99
                _goal(goals, f"{name}: admitted p99 / p99 at the knee", f"{ratio:.2f}", "<= 2", verdict(ratio <= 2))
            ratio = o["throughput_rps"] / best if best else 0.0
            _goal(goals, f"{name}: throughput / best closed loop", f"{ratio:.2f}", ">= 0.95", verdict(ratio >= 0.95))
            pair = next((x for x in sys_.get("paired") or [] if x["factor"] == o["factor"]), None)
            if pair:
                rounds = " / ".join(f"{x:.2f}" for x in pair["ratios"])
                _goal(goals, f"{name}: throughput / the best closed point re-measured just before it (median of "
                             f"rounds: {rounds})", f"{pair['median']:.2f}", ">= 0.95", verdict(pair["median"] >= 0.95))
            rej = o.get("reject_p99_s")
            _goal(goals, f"{name}: 503 p99 (ms)", _ms(rej), "< 10", verdict(rej is None or rej < 0.010))
            bad = o["errors"] + o["timeouts"]
            _goal(goals, f"{name}: errors + timeouts", str(bad), "0", verdict(bad == 0))
        p8 = next((p for p in sys_["points"] if p["concurrency"] == 8), None)
        if p8 and p8["latency_p50_s"]:
            ratio = p8["latency_p99_s"] / p8["latency_p50_s"]
            _goal(goals, f"[{key}] c=8: p99 / p50 (starvation)", f"{ratio:.2f}", "<= 2", verdict(ratio <= 2))
        rej = sys_.get("server_503") or {}
        if rej.get("count"):  # the client's clock adds its own scheduling on the same 2 cores as the server
            _goal(goals, f"[{key}] 503 p99 as the server timed it, whole run (ms)", f"{rej['p99_ms']:.1f}", "< 10",
                  verdict(rej["p99_ms"] < 10))
        settle = (sys_.get("step") or {}).get("settle_s") or []
        if settle and all(s is not None for s in settle):
            worst = max(settle)
            _goal(goals, f"[{key}] step 0.5x -> 3x -> 0.5x: the limit settles within (s)",
                  " / ".join(f"{s:g}" for s in settle), f"<= {SETTLE_GOAL_S:g}", verdict(worst <= SETTLE_GOAL_S))
    d = systems.get("defaults") or {}
    fixed = [s for k, s in systems.items() if k != "defaults" and s.get("points")]
    for p in d.get("points", []):
        rivals = [q["throughput_rps"] for s in fixed for q in s["points"] if q["concurrency"] == p["concurrency"]]
        if rivals and max(rivals) > 0:
            ratio = p["throughput_rps"] / max(rivals)
            _goal(goals, f"[defaults] c={p['concurrency']}: throughput / best fixed", f"{ratio:.2f}", ">= 0.95",
                  ratio >= 0.95)
    return goals


def _clients(p: dict) -> str:
    """A point's clients: ``8/4/8`` where its rounds ran different ones (the latencies are the median round's,
    the counts all rounds')."""
    return "/".join(str(c) for c in p["concurrencies"]) if p.get("concurrencies") else str(p["concurrency"])


def _rows(sys_: dict) -> list[tuple[str, dict, Any]]:
    rows: list[tuple[str, dict, Any]] = [(f"closed c={p['concurrency']}", p, p.get("limit_last"))
                                         for p in sys_.get("points", [])]
    rows += [(f"closed c={_clients(p)} again, before {p['factor']:g}x", p, None) for p in sys_.get("refs", [])]
    rows += [(f"open {o['factor']:g}x ({o['rate_rps']:.2f}/s)", o, None) for o in sys_.get("open", [])]
    step = sys_.get("step") or {}
    names = ("step 0.5x", "step 3x", "step 0.5x again")
    rows += [(f"{names[i]} ({p['rate_rps']:.2f}/s)", p, None) for i, p in enumerate(step.get("phases", []))]
    return rows


def markdown(r: dict) -> str:
    cfg = r["config"]
    runs = r.get("runs") or []
    merged = (" Systems measured in separate runs (each under an exclusive lock of the machine): "
              + "; ".join(f"{', '.join(x['systems'])} at {x['started']} (load average {x['loadavg_start'][0]:.2f})"
                          for x in runs) + ".") if len(runs) > 1 else ""
    lines = [
        "# Overload with the defaults: admission benchmark", "",
        (f"Run {r['started']}, {r['cores']} cores, model `{r['model']}`; every request `POST /v1/tts` streamed "
         f"16-bit PCM of \"{r['text']}\". "
         f"{'QUICK SMOKE RUN: the numbers mean nothing. ' if cfg.get('quick') else ''}"
         f"Closed loop {cfg['point_s']:g} s measured after {cfg['warmup_s']:g} s (a 503 costs its client "
         f"{backoff(cfg.get('reject_backoff_s'))}); open loop {cfg['overload_s']:g} s per rate (goodput: the work done "
         f"while the arrivals lasted); "
         + (f"step phases {cfg['step_s']:g} s. " if cfg["step_s"] > 0 else "no step test. ")
         + (f"Every closed- and open-loop point measured in {cfg['rounds']} rounds (all points of a round, then "
            "the next round): each row is the point's median round, its req/s range over the rounds in "
            "brackets, its counts summed. " if cfg.get("rounds", 1) > 1 else "")
         + ("Just before each open-loop rate the system's best closed-loop point so far ran again (the "
            "\"again\" rows): goodput is graded against the best point of the whole sweep and, a minute apart "
            "on the same host, against that one (each round's ratio, their median). " if cfg.get("paired") else "")
         + (f"The servers ran at nice {cfg['server_nice']}. " if cfg.get("server_nice", 0) > 0 else "")
         + (f"The load generator ran in {r['load_generator']} (bench/lib/sched.py: on the same cores a client in the "
            "normal class waits behind the servers' compute threads, and its timings with it; a real "
            "deployment's clients are elsewhere). " if r.get("load_generator") else "")
         + f"Load average at start {r['loadavg_start'][0]:.2f}, at end {r['loadavg_end'][0]:.2f}. "
         "Latencies in ms (send to last byte, admitted requests); goodput in requests and audio seconds per "
         f"wall second.{merged}"
         + ("" if cfg.get("sequential") or merged else
            " The servers ran side by side, idle but for the one measured, phase by phase in turn (c=1 of each, "
            "then c=2 of each, ...; every other round the systems in reverse order), so a drift of the machine's "
            "speed during the run hits every system alike.")),
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
        lines += ["| load | req/s | audio-s/s | p50 | p99 | TTFA p50 | 503s | 503 p99 | errors | timeouts | limit |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, p, limit in _rows(sys_):
            lines.append(f"| {name} | {p['throughput_rps']:.2f}{spread(p)} | {p.get('audio_per_s', 0.0):.1f} | "
                         f"{_ms(p['latency_p50_s'])} | {_ms(p['latency_p99_s'])} | {_ms(p['ttfa_p50_s'])} | "
                         f"{p['rejected']} | {_ms(p['reject_p99_s'])} | {p['errors']} | {p['timeouts']} | "
                         f"{'-' if limit is None else f'{limit:g}'} |")
        step = sys_.get("step") or {}
        series = step.get("series") or []
        if series:
            every = max(1, len(series) // 40)
            pts = ", ".join(f"{p['t']:.0f}s:{p['limit']:g}" for p in series[::every] if p.get("limit") is not None)
            lines += ["", f"Step test, admission limit over time (s since the first phase began at "
                          f"{step.get('poll_offset_s', 0):.1f} s; phases change every {step['step_s']:g} s; "
                          f"settled {step.get('settle_s')} s after each change): {pts}"]
        lines.append("")
    lines += ["## Goals", "", "| goal | value | target | result |", "|---|---|---|---|"]
    for g in r.get("goals", []):
        lines.append(f"| {g['goal']} | {g['value']} | {g['target']} | "
                     f"{({True: 'PASS', False: 'FAIL', None: 'info'})[g['pass']]} |")
    return "\n".join(lines) + "\n"


def merge(runs: list[dict]) -> dict:
    """One report from runs of single systems (each run short enough for a quiet machine): the first run's
    header, every run's systems (a later run's system of the same name wins), the goals graded again."""
    out = dict(runs[0])
    out["systems"] = {}
    out["runs"] = [{"started": r["started"], "systems": list(r["systems"]), "loadavg_start": r["loadavg_start"],
                    "loadavg_end": r["loadavg_end"]} for r in runs]
    for r in runs:
        out["systems"].update(r["systems"])
    out["loadavg_end"] = runs[-1]["loadavg_end"]
    out["goals"] = evaluate_goals(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.lib.admission_report OUT_DIR RUN.json...``: merge runs into OUT_DIR/admission.{json,md}."""
    import json
    import sys
    from pathlib import Path

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m bench.lib.admission_report OUT_DIR RUN.json [RUN.json ...]", file=sys.stderr)
        return 2
    out_dir = Path(args[0])
    merged = merge([json.loads(Path(p).read_text()) for p in args[1:]])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "admission.json").write_text(json.dumps(merged, indent=1) + "\n")
    (out_dir / "admission.md").write_text(markdown(merged))
    print(f"wrote {out_dir}/admission.json, admission.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
