"""Abuse suite (issue 36): a polite client alone, then beside each adversary, against the server's defaults.

    python -m bench serve --scenario abuse [--phase-s 30] [--only dribblers,storm-8] [--out DIR] [--model-dir DIR]

The phases, what is printed and the goals: docs/benchmarks/README.md, "Abuse".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.lib import load, prom
from bench.lib.admission_server import pool_server, work
from bench.lib.load import LoadClient, Result
from bench.lib.procs import ROOT, ServerProc, SuiteParser, logger, start_run
from bench.lib.sched import realtime_client
from bench.report import (
    abuse_goals,
    abuse_markdown,
    abuse_row,
    print_goals,
    reference,
    save,
    server_log,
    server_refusal_p99_ms,
    storm_rates,
)

# phase -> (adversary kind for bench/lib/abuse_clients.py, its clients); None: the polite client alone
PHASES: dict[str, tuple[str | None, int]] = {
    "dribblers": ("dribble", 4), "slow-heads": ("slow-head", 1000), "non-readers": ("nonread", 4), "ws-idle": ("ws-idle", 8),
    "ws-chatty": ("ws-chatty", 8), "ws-long": ("ws-long", 1), "http-long": ("http-long", 1),
    "giant-fields": ("giant", 2), "huge-body": ("huge", 1), "huge-chunked": ("huge-chunked", 1),
    "storm-8": ("storm", 8), "storm-64": ("storm", 64), "storm-64-fresh": ("storm-fresh", 64),
}


log = logger("abuse")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = SuiteParser(__doc__, "abuse", realtime=True)
    ap.add_argument("--phase-s", type=float, default=30.0, help="measured seconds of each phase")
    ap.add_argument("--lead-s", type=float, default=3.0,
                    help="seconds the adversary runs before the polite client's measured window opens")
    ap.add_argument("--only", help=f"comma list of adversary phases (default all: {', '.join(PHASES)}); the alone "
                    "phase runs first and last regardless")
    ap.add_argument("--adversary-nice", type=int, default=10,
                    help="niceness of the adversary process, which on one host steals the server's CPU (0: none)")
    ap.add_argument("--rss-guard-mb", type=int, default=6000, help="kill the server past this tree RSS (0: no guard)")
    args = ap.parse(argv)
    only = [p.strip() for p in (args.only or ",".join(PHASES)).split(",") if p.strip()]
    unknown = [p for p in only if p not in PHASES]
    if unknown:
        ap.error(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(PHASES)}")
    args.phases = ["alone", *only, "alone-again"]
    return args


def cpu_s(t: Any, children: bool = False) -> float:
    return t.children_user + t.children_system if children else t.user + t.system


async def polite(url: str, hi: float, timeout_s: float) -> tuple[list[Result], list[str]]:
    """One closed-loop client until ``hi``: a 503 costs it the pause its Retry-After names (a failure: 0.5 s)."""
    spec, results = work(), []
    async with LoadClient(url, timeout_s, max_connections=2) as lc:
        while time.monotonic() < hi:
            r = await lc.send(spec)
            results.append(r)
            pause = (load.retry_pause_s(r.retry_after) if r.kind == "rejected"
                     else 0.5 if r.kind in ("error", "timeout") else 0.0)
            if pause:
                await asyncio.sleep(min(pause, max(0.0, hi - time.monotonic())))
        return results, lc.errors


def statuses(results: list[Result]) -> dict[str, int]:
    """The polite client's answers other than 200, by status (a 503 with its Retry-After; none: ``no answer``)."""
    def key(r: Result) -> str:
        if not r.status:
            return f"no answer ({r.kind})"
        return f"{r.status} (Retry-After {r.retry_after})" if r.retry_after is not None else str(r.status)

    return dict(Counter(key(r) for r in results if r.status != 200))


async def adversary(kind: str, clients: int, srv: ServerProc, seconds: float, nice: int) -> asyncio.subprocess.Process:
    argv = [sys.executable, "-m", "bench.lib.abuse_clients", kind, "--url", srv.base_url, "--clients", str(clients),
            "--seconds", f"{seconds:.1f}", "--server-pid", str(srv.proc.pid)]
    if nice > 0:
        argv = ["nice", "-n", str(nice), *argv]
    proc = await asyncio.create_subprocess_exec(*argv, cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if line.strip() != b"ready":
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"adversary {kind} did not start: {line!r}")
    return proc


async def tally_of(proc: asyncio.subprocess.Process, wait_s: float) -> dict | None:
    try:
        out = await asyncio.wait_for(proc.stdout.read(), wait_s)
        await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    lines = out.decode(errors="replace").strip().splitlines()
    return json.loads(lines[-1]) if lines else None


async def wait_metrics(url: str, done: Callable[[dict[str, float]], bool], limit_s: float) -> float | None:
    """Seconds until ``done(the server's /metrics samples)``, read every 0.5 s; None: not within ``limit_s``."""
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=url) as client:
        while time.monotonic() - t0 < limit_s:
            with contextlib.suppress(httpx.HTTPError):
                if done(await prom.ascrape(client)):
                    return round(time.monotonic() - t0, 1)
            await asyncio.sleep(0.5)
    return None


# non-readers' streams are synthesised first (at most this long): measured is what they hold unread, not their compute
NONREAD_LEAD_MAX_S = 180.0


async def run_phase(srv: ServerProc, name: str, args: argparse.Namespace) -> dict[str, Any]:
    kind, clients = PHASES.get(name, (None, 0))
    proc = None
    start = (srv.rss.now(), srv.rss.elapsed(), srv.log_path.stat().st_size)  # before the adversary's first byte
    lead_s = args.lead_s
    try:
        if kind == "nonread":
            before = prom.scrape(srv.base_url, timeout=5).get("tts_engine_jobs_total", 0.0)  # nothing runs yet
            proc = await adversary(kind, clients, srv, NONREAD_LEAD_MAX_S + args.phase_s, args.adversary_nice)
            lead_s = await wait_metrics(srv.base_url, lambda m: m.get("tts_engine_jobs_total", 0) >= before + clients,
                                        NONREAD_LEAD_MAX_S) or NONREAD_LEAD_MAX_S  # engine jobs: outcomes summed
            log(f"{name}: their {clients} streams were made in {lead_s:.1f} s; measuring beside them")
            lead_s = 0.0
        elif kind is not None:
            proc = await adversary(kind, clients, srv, args.lead_s + args.phase_s, args.adversary_nice)
        return await measure(srv, name, kind, clients, proc, start, args, lead_s)
    finally:
        if proc is not None and proc.returncode is None:  # an error on the way: no adversary outlives its phase
            proc.kill()
            await proc.wait()


async def measure(srv: ServerProc, name: str, kind: str | None, clients: int, proc: asyncio.subprocess.Process | None,
                  start: tuple[int, float, int], args: argparse.Namespace, lead_s: float) -> dict[str, Any]:
    """The polite client's window beside the running adversary ``proc``; ``start``: the server's RSS, the RSS
    sampler's clock and the log's size before the adversary started."""
    me, server = psutil.Process(), psutil.Process(srv.proc.pid)
    rss_start, since, log_at = start
    t0, c_me, c_srv, c_kids = time.monotonic(), me.cpu_times(), cpu_s(server.cpu_times()), me.cpu_times()
    lo = t0 + (lead_s if kind else 0.0)
    hi = lo + args.phase_s
    sent, errors = await polite(srv.base_url, hi, args.timeout_s)
    results = [r for r in sent if r.start + r.latency_s >= lo]  # the measured window's (as load.closed_loop keeps)
    if proc is not None and proc.returncode is None:
        proc.send_signal(signal.SIGUSR1)  # the window is over: the adversary ends now and reports
    tally = await tally_of(proc, args.phase_s + 60) if proc is not None else None
    wall = time.monotonic() - t0
    after = me.cpu_times()
    s = load.summarize(results, hi - lo, errors, window=(lo, hi))
    phase: dict[str, Any] = {
        "name": name, "adversary": kind, "clients": clients, "polite": s.to_dict(), "polite_statuses": statuses(sent),
        "rss_start": rss_start, "rss_peak": max(srv.rss.peak(since), rss_start), "rss_end": srv.rss.now(),
        "cpu": {"server": (cpu_s(server.cpu_times()) - c_srv) / wall, "bench": (cpu_s(after) - cpu_s(c_me)) / wall,
                "adversary": (cpu_s(after, True) - cpu_s(c_kids, True)) / wall},
        "tally": tally, "window_monotonic": [lo, hi],
    }
    if kind and kind.startswith("storm") and tally:
        phase["storm"] = storm_rates(tally, lo, hi)
        phase["storm"]["total_rps"] = phase["storm"]["goodput_rps"] + s.throughput_rps
    phase["settle_s"] = await wait_metrics(srv.base_url, lambda m: not m.get("tts_inflight_requests"), 20.0)
    with open(srv.log_path, "rb") as f:  # what the server logged during the phase and its settling
        f.seek(log_at)
        text = f.read().decode(errors="replace")
    phase["server_log"], phase["server_4xx_p99_ms"] = server_log(text), server_refusal_p99_ms(text)
    phase["server_4xx_held_p99_ms"] = server_refusal_p99_ms(text, held=True)
    return phase


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.lib.model import ensure_model

    model_dir = args.model_dir or ensure_model(2)
    run_dir, results = start_run("abuse", args, log, model=Path(model_dir).name, phase_s=args.phase_s,
                                 lead_s=args.lead_s, phases=[])
    log(f"model {results['model']}; phases {', '.join(args.phases)}; {args.phase_s:g} s each")
    srv = pool_server("abuse", {}, 0, model_dir, run_dir)
    srv.rss_limit_bytes = args.rss_guard_mb * 1024 * 1024
    with realtime_client(args.client_rt_priority) as scheduling, srv:
        results["load_generator"] = scheduling
        log(f"server up on {srv.base_url} (no pool settings); load generator: {scheduling}")
        asyncio.run(load.fixed_count(srv.base_url, work(), 4, 1, args.timeout_s))  # warm-up, not measured
        for name in args.phases:
            if srv.proc.poll() is not None or srv.rss.limit_hit:
                log(f"server gone (exit {srv.proc.poll()}, RSS guard hit: {srv.rss.limit_hit}); phases left out")
                results["server_gone_before"] = name
                break
            try:
                p = asyncio.run(run_phase(srv, name, args))
            except Exception as exc:
                log(f"{name} FAILED: {type(exc).__name__}: {str(exc)[:500]}")
                results.setdefault("failed", {})[name] = f"{type(exc).__name__}: {exc}"[:2000]
                continue
            results["phases"].append(p)
            print(" | ".join(abuse_row(p, reference(results["phases"]))), flush=True)
    results["loadavg_end"] = os.getloadavg()
    results["reference"] = reference(results["phases"])
    results["goals"] = abuse_goals(results["phases"])
    save(args.out, "abuse", results, abuse_markdown(results))
    print_goals(results["goals"], f"Goals (against the mean of the {results['reference']['runs']} alone phases)")
    return 0
