"""Benchmark goals, and the files a run writes: run.json, run.md and PNG plots."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

PLOTS = ("throughput.png", "latency.png", "ttfa.png", "rss.png")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _mib(v: float | None) -> str:
    return "-" if not v else f"{v / 2**20:.0f}"


def _pool_text(cfg: dict) -> str:
    """cosyserve's pool settings in a run: none means the server's defaults."""
    parts = [f"{k}={cfg[c]}" for k, c in (("workers", "server_workers"), ("max_queue", "max_queue"))
             if cfg.get(c) is not None]
    return ", ".join(parts) if parts else "the server's defaults (no pool settings)"


def _point(system: dict, concurrency: int) -> dict | None:
    return next((p for p in system.get("points", []) if p["concurrency"] == concurrency), None)


def _goal(goals: list, name: str, value: str, target: str, ok: bool | None) -> None:
    goals.append({"goal": name, "value": value, "target": target, "pass": ok})


def drift(series: list[float | None]) -> tuple[float, float] | None:
    """Median of the first and of the last k values (k = min(10, n/4))."""
    vals = [v for v in series if v is not None]
    if len(vals) < 2:
        return None
    k = max(1, min(10, len(vals) // 4))
    return statistics.median(vals[:k]), statistics.median(vals[-k:])


def evaluate_goals(r: dict) -> list[dict]:
    goals: list[dict] = []
    workers = r["config"]["workers"]
    th, pr = r.get("ceiling_threads"), r.get("ceiling_processes")
    b = r["systems"].get("cosyserve")
    c = r["systems"].get("per_request")
    if b and th:
        ceiling = th["cw"]["throughput_rps"]
        for p in b["points"]:
            if p["concurrency"] >= workers and ceiling:
                ratio = p["throughput_rps"] / ceiling
                _goal(goals, f"(b) throughput at c={p['concurrency']} / (a) {workers}-thread ceiling",
                      f"{ratio:.3f}", ">= 0.95", ratio >= 0.95)
    if b and pr:
        ceiling = pr["closed"]["throughput_rps"]
        for p in b["points"]:
            if p["concurrency"] >= workers and ceiling:
                ratio = p["throughput_rps"] / ceiling
                _goal(goals, f"(b) throughput at c={p['concurrency']} / (a) {pr['processes']}-process ceiling",
                      f"{ratio:.3f}", ">= 0.95", ratio >= 0.95)
    if b:
        base = _point(b, workers)
        base_p99 = base["latency_p99_s"] if base else None
        top = max((p["concurrency"] for p in b["points"]), default=None)
        for name, p in ((f"c={top}", _point(b, top) if top else None), ("3x overload", b.get("overload"))):
            if not p:
                continue
            rej = p.get("reject_p99_s")
            _goal(goals, f"(b) {name}: 503 reject latency p99 (ms)", _ms(rej), "< 10",
                  None if rej is None else rej < 0.010)
            adm = p.get("latency_p99_s")
            if adm is not None and base_p99:
                _goal(goals, f"(b) {name}: admitted p99 / p99 at c={workers}", f"{adm / base_p99:.2f}", "<= 2",
                      adm <= 2 * base_p99)
            other = p["errors"] + p["timeouts"]
            _goal(goals, f"(b) {name}: errors + timeouts (not 503)", str(other), "0", other == 0)
    if b and th:
        bp, ap = _point(b, 1), th["c1"]
        if bp and bp["latency_p50_s"] is not None and ap["latency_p50_s"] is not None:
            delta = bp["latency_p50_s"] - ap["latency_p50_s"]
            _goal(goals, "(b) p50 latency at c=1 minus (a) in-process (ms)", _ms(delta), "<= 10", delta <= 0.010)
        if c and ap["latency_p50_s"]:
            cp = _point(c, 1)
            if cp and cp["latency_p50_s"] is not None:
                _goal(goals, "(c) p50 latency at c=1 / (a) synthesis time", f"{cp['latency_p50_s'] / ap['latency_p50_s']:.2f}",
                      "info", None)
            _goal(goals, "engine load time / synthesis time (the price (c) pays per request)",
                  f"{th['load_s'] / ap['latency_p50_s']:.2f} ({th['load_s'] * 1000:.0f} ms / "
                  f"{ap['latency_p50_s'] * 1000:.0f} ms)", "info", None)
        ttfa = (b.get("ttfa") or {}).get("ttfa_p50_s")
        own = th.get("first_chunk_p50_s")
        if ttfa is not None and own is not None:
            delta = ttfa - own
            _goal(goals, "(b) stream TTFA p50 minus the engine's own first chunk (ms)", _ms(delta), "<= 5",
                  delta <= 0.005)
    if b and b.get("ttfa_series"):
        d = drift(b["ttfa_series"])
        if d:
            first, last = d
            n = len(b["ttfa_series"])
            ok = abs(last - first) <= max(0.005, 0.10 * first)
            _goal(goals, f"(b) TTFA drift: median of last vs first streams (of {n}), ms",
                  f"{last * 1000:.1f} vs {first * 1000:.1f}", "within 10% or 5 ms", ok)
    if th and th.get("first_chunk_s"):
        d = drift(th["first_chunk_s"])
        if d:
            _goal(goals, "(a) engine first chunk drift: last vs first streams, ms",
                  f"{d[1] * 1000:.1f} vs {d[0] * 1000:.1f}", "info", None)
    mem = (b or {}).get("memory")
    if mem and mem.get("growth") is not None:
        _goal(goals, f"(b) RSS growth over {mem['requests']} requests after warm-up",
              f"{mem['growth'] * 100:+.2f}% ({_mib(mem['rss_before'])} -> {_mib(mem['rss_after'])} MiB)",
              "<= +2%", mem["growth"] <= 0.02)
    return goals


def print_goals(goals: list[dict]) -> None:
    print("\nGoals")
    for g in goals:
        mark = {True: "PASS", False: "FAIL", None: "info"}[g["pass"]]
        print(f"  [{mark}] {g['goal']}: {g['value']} (target {g['target']})")


def markdown(r: dict) -> str:
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
    th, pr = r.get("ceiling_threads"), r.get("ceiling_processes")
    if th or pr:
        lines += ["## (a) Ceilings: the engine in-process, no HTTP", "",
                  "| setup | throughput (req/s) | p50 | p99 |", "|---|---|---|---|"]
        if th:
            for label, s in (("1 thread", th["c1"]), (f"{th['workers']} threads, one engine each", th["cw"])):
                lines.append(f"| {label} | {s['throughput_rps']:.2f} | {_ms(s['latency_p50_s'])} | {_ms(s['latency_p99_s'])} |")
        if pr:
            s = pr["closed"]
            lines.append(f"| {pr['processes']} processes, one engine each | {s['throughput_rps']:.2f} | "
                         f"{_ms(s['latency_p50_s'])} | {_ms(s['latency_p99_s'])} |")
        if th:
            note = (f"Engine load {th['load_s'] * 1000:.0f} ms (first, with imports: {th['load_s_first']:.1f} s); "
                    f"own first streamed chunk p50 {_ms(th['first_chunk_p50_s'])} ms.")
            lines += ["", note, ""]
    lines += ["## HTTP systems", "",
              "| system | load | req/s | p50 | p95 | p99 | TTFA p50 | 503s | 503 p99 | errors | timeouts | peak RSS |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for sys_ in r["systems"].values():
        rows = [(f"c={p['concurrency']}", p) for p in sys_["points"]]
        if sys_.get("overload"):
            o = sys_["overload"]
            rows.append((f"open {o['rate_rps']:.2f}/s", o))
        for name, p in rows:
            lines.append(f"| {sys_['label']} | {name} | {p['throughput_rps']:.2f} | {_ms(p['latency_p50_s'])} | "
                         f"{_ms(p['latency_p95_s'])} | {_ms(p['latency_p99_s'])} | {_ms(p['ttfa_p50_s'])} | "
                         f"{p['rejected']} | {_ms(p['reject_p99_s'])} | {p['errors']} | {p['timeouts']} | "
                         f"{_mib(p.get('peak_rss'))} |")
    for sys_ in r["systems"].values():
        if sys_.get("failed"):
            lines.append(f"\n**{sys_['label']} failed:** `{sys_['failed'][:300]}`")
        if sys_.get("rss_limit_hit"):
            lines.append(f"\n**{sys_['label']} was killed at the RSS limit ({r['config']['max_rss_gb']:g} GiB)**"
                         f"{'; points after that were skipped' if sys_.get('stopped') else ''}.")
    lines += ["", "## Goals", "", "| goal | value | target | result |", "|---|---|---|---|"]
    for g in r.get("goals", []):
        lines.append(f"| {g['goal']} | {g['value']} | {g['target']} | {({True: 'PASS', False: 'FAIL', None: 'info'})[g['pass']]} |")
    lines += ["", *[f"![{p}]({p})" for p in PLOTS], ""]
    return "\n".join(lines)


def plots(r: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = r["systems"]
    th, pr = r.get("ceiling_threads"), r.get("ceiling_processes")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for sys_ in systems.values():
        xs = [p["concurrency"] for p in sys_["points"]]
        ax.plot(xs, [p["throughput_rps"] for p in sys_["points"]], marker="o", label=sys_["label"])
    if th:
        ax.axhline(th["cw"]["throughput_rps"], color="k", ls="--", label=f"(a) {th['workers']} threads")
        ax.axhline(0.95 * th["cw"]["throughput_rps"], color="k", ls=":", label="0.95 x (a) threads")
    if pr:
        ax.axhline(pr["closed"]["throughput_rps"], color="grey", ls="-.", label=f"(a) {pr['processes']} processes")
    ax.set(xscale="log", xlabel="concurrent clients", ylabel="successful requests / s", title="Throughput")
    ax.set_xticks(r["config"]["concurrency"], [str(c) for c in r["config"]["concurrency"]])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, sys_ in enumerate(systems.values()):
        xs = [p["concurrency"] for p in sys_["points"]]
        color = f"C{i}"
        ax.plot(xs, [(p["latency_p50_s"] or float("nan")) * 1000 for p in sys_["points"]], marker="o", color=color,
                label=f"{sys_['label']} p50")
        ax.plot(xs, [(p["latency_p99_s"] or float("nan")) * 1000 for p in sys_["points"]], marker="^", ls="--",
                color=color, label=f"{sys_['label']} p99")
    if th and th["c1"]["latency_p50_s"]:
        ax.axhline(th["c1"]["latency_p50_s"] * 1000, color="k", ls=":", label="(a) in-process, 1 thread")
    has_data = any(p["latency_p50_s"] for sys_ in systems.values() for p in sys_["points"])
    ax.set(xscale="log", yscale="log" if has_data else "linear", xlabel="concurrent clients", ylabel="latency (ms)",
           title="Latency (admitted)")
    ax.set_xticks(r["config"]["concurrency"], [str(c) for c in r["config"]["concurrency"]])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    b = systems.get("cosyserve")
    if b and b.get("ttfa_series"):
        ys = [(v or float("nan")) * 1000 for v in b["ttfa_series"]]
        ax.plot(range(1, len(ys) + 1), ys, marker=".", ls="-", label="(b) cosyserve, HTTP stream")
    if th and th.get("first_chunk_s"):
        ys = [v * 1000 for v in th["first_chunk_s"]]
        ax.plot(range(1, len(ys) + 1), ys, marker=".", ls="-", label="(a) engine's own first chunk")
    ax.set(xlabel="stream number (sequential)", ylabel="time to first audio (ms)", title="Time to first audio")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ttfa.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for sys_ in systems.values():
        series = sys_.get("rss_series") or []
        if series:
            ax.plot([t for t, _ in series], [v / 2**20 for _, v in series], label=sys_["label"])
    ax.set(xlabel="seconds since the server was ready", ylabel="RSS of the server process tree (MiB)",
           title="Memory")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "rss.png", dpi=110)
    plt.close(fig)


def write_outputs(r: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(r, indent=1, default=_jsonable) + "\n")
    (out / "run.md").write_text(markdown(r))
    plots(r, out)


def _jsonable(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")
