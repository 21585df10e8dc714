"""Overload with the defaults: admission as a user gets it, against fixed sizings (issue 20).

    python -m bench serve --scenario admission [--quick] [--rounds 3] [--systems defaults,before,tuned] [--out DIR]

The systems, phases, points and goals: docs/benchmarks/README.md, "Overload with the defaults".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.lib import load
from bench.lib.admission_server import TEXT, Poller, pool_server, work
from bench.lib.load import Result
from bench.lib.procs import ServerProc, SuiteParser, logger, start_run
from bench.lib.sched import realtime_client
from bench.report import (
    admission_goals,
    admission_markdown,
    best_closed,
    ms,
    paired_ratios,
    per_point,
    print_goals,
    save,
    server_log,
    settle_times,
)

log = logger("admission")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = SuiteParser(__doc__, "admission", quick="smoke run: a few seconds per point (numbers meaningless)",
                     realtime=True)
    ap.add_argument("--systems", default="defaults,before,tuned", help="comma list of defaults, before, tuned")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--factors", default="1.5,3", help="open-loop rates, in best closed-loop throughputs")
    ap.add_argument("--point-s", type=float, help="measured seconds per closed-loop point (default 25)")
    ap.add_argument("--warmup-s", type=float, help="unmeasured seconds before each closed-loop point (default 5)")
    ap.add_argument("--overload-s", type=float, help="seconds of open-loop arrivals per rate (default 30)")
    ap.add_argument("--step-s", type=float, help="seconds of each step-test phase (default 20; 0: no step test)")
    ap.add_argument("--tuned-workers", type=int, default=2, help="pool.workers of the hand-tuned fixed system")
    ap.add_argument("--tuned-queue", type=int, default=2, help="pool.max_queue of the hand-tuned fixed system")
    ap.add_argument("--sequential", action="store_true",
                    help="one server after another (default: all started, their phases interleaved)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every point this many times, round after round, and report its median round")
    ap.add_argument("--no-paired", dest="paired", action="store_false",
                    help="do not re-measure the best closed-loop point just before each open-loop rate")
    ap.add_argument("--server-nice", type=int, default=5, help="the servers' niceness (0: the load generator's)")
    ap.add_argument("--reject-backoff-s", type=float, default=None,
                    help="closed-loop client pause after a 503 (default: the Retry-After it names)")
    args = ap.parse(argv, quick={"point_s": 3.0, "warmup_s": 1.0, "overload_s": 4.0, "step_s": 4.0},
                    full={"point_s": 25.0, "warmup_s": 5.0, "overload_s": 30.0, "step_s": 20.0})
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.factors = [float(f) for f in args.factors.split(",") if f.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    return args


def pool_settings(system: str, args: argparse.Namespace) -> dict[str, Any]:
    """The pool section each system runs with; ``defaults`` has none at all."""
    tuned = {"admission": "fixed", "workers": args.tuned_workers, "max_queue": args.tuned_queue}
    if system not in ("defaults", "before", "tuned"):
        raise ValueError(f"unknown system {system!r}")
    return {"defaults": {}, "before": {"admission": "fixed"}, "tuned": tuned}[system]


def server(system: str, args: argparse.Namespace, model_dir: str, run_dir: Path) -> ServerProc:
    return pool_server(system, pool_settings(system, args), args.server_nice, model_dir, run_dir)


def phase_summary(results: list[Result], t0: float, lo: float, hi: float, rate: float) -> dict[str, Any]:
    """The requests sent in [lo, hi) seconds after ``t0``: latency, 503s, goodput over that span."""
    sent = [r for r in results if lo <= r.start - t0 < hi]
    s = load.summarize(sent, hi - lo)
    return {"rate_rps": rate, "from_s": lo, "to_s": hi, **s.to_dict()}


class SystemRun:
    """One system's measurements, phase by phase (each phase an ``async`` call against its running server)."""

    def __init__(self, system: str, srv: ServerProc, args: argparse.Namespace) -> None:
        self.system, self.srv, self.args = system, srv, args
        self.url, self.spec = srv.base_url, work()
        self.out: dict[str, Any] = {"system": system, "pool": pool_settings(system, args), "points": [], "open": [],
                                    "refs": []}

    async def warm(self) -> None:
        await load.fixed_count(self.url, self.spec, 4, 2, self.args.timeout_s)  # allocator, caches: not measured

    async def _closed_loop(self, c: int) -> tuple[load.Summary, list[float]]:
        """A closed loop of ``c`` clients with the gauges read throughout: its summary and the limit's readings."""
        args = self.args
        with Poller(self.url, time.monotonic()) as poll:
            s = await load.closed_loop(self.url, self.spec, c, args.point_s, warmup_s=args.warmup_s,
                                       timeout_s=args.timeout_s, reject_backoff_s=args.reject_backoff_s)
        return s, poll.limits

    async def closed(self, c: int) -> None:
        s, limits = await self._closed_loop(c)
        self.out["points"].append({"kind": "closed", "concurrency": c, **s.to_dict(),
                                   "limit_last": limits[-1] if limits else None, "limits": limits})
        log(f"  {self.system} c={c}: {s.brief()} limit={limits[-1] if limits else '-'}")

    async def reference(self, factor: float) -> None:
        """The best closed-loop point so far measured again just before the open loop at ``factor`` (the same
        host a minute apart), reading the gauges as the open loop does (a scrape costs the server CPU)."""
        c = best_closed(per_point(self.out["points"], "concurrency"))["concurrency"]
        s, limits = await self._closed_loop(c)
        self.out["refs"].append({"kind": "closed", "factor": factor, "concurrency": c, **s.to_dict(),
                                 "limits": limits})
        log(f"  {self.system} c={c} again, before {factor:g}x: {s.brief()}")

    @property
    def capacity(self) -> float:
        return best_closed(per_point(self.out["points"], "concurrency"))["throughput_rps"]

    async def overload(self, factor: float) -> None:
        args, rate = self.args, factor * self.capacity
        self.out["capacity_rps"] = self.capacity
        with Poller(self.url, time.monotonic()) as poll:  # goodput: the work done while the arrivals lasted
            s = await load.open_loop(self.url, self.spec, rate, args.overload_s, timeout_s=args.timeout_s, window=True)
        self.out["open"].append({"factor": factor, "rate_rps": rate, **s.to_dict(), "limits": poll.limits})
        log(f"  {self.system} open {factor:g}x ({rate:.2f}/s): {s.brief()}")

    async def step(self) -> None:
        args, capacity = self.args, self.capacity
        phases = [(0.5 * capacity, args.step_s), (3.0 * capacity, args.step_s), (0.5 * capacity, args.step_s)]
        t_start = time.monotonic()
        with Poller(self.url, t_start) as poll:
            results, t0 = await load.open_phases(self.url, self.spec, phases, args.timeout_s, seed=2)
            await asyncio.sleep(0.6)
        step = {
            "phases": [phase_summary(results, t0, i * args.step_s, (i + 1) * args.step_s, rate)
                       for i, (rate, _) in enumerate(phases)],
            "series": poll.series, "step_s": args.step_s, "poll_offset_s": t0 - t_start,
        }
        step["settle_s"] = settle_times(step)
        self.out["step"] = step
        log(f"  {self.system} step 0.5x -> 3x -> 0.5x: limit settled after {step['settle_s']} s "
            f"(admitted p99 per phase: {[ms(p['latency_p99_s'], 0, ' ms') for p in step['phases']]})")

    def plan(self) -> list[tuple[int, Callable[[], Awaitable[None]]]]:
        """The calls in order, each with its round: warm-up; per round, closed loop per concurrency and open loop
        per factor; the step test (the last round's)."""
        out: list[tuple[int, Callable[[], Awaitable[None]]]] = [(0, self.warm)]
        for r in range(self.args.rounds):  # each round closed then open loop: a drift hits both alike
            out += [(r, functools.partial(self.closed, c)) for c in self.args.concurrency]
            for f in self.args.factors:
                if self.args.paired:
                    out.append((r, functools.partial(self.reference, f)))
                out.append((r, functools.partial(self.overload, f)))
        if self.args.step_s > 0:
            out.append((self.args.rounds - 1, self.step))
        return out

    def report(self) -> dict[str, Any]:
        """What was measured, each point its median round (every round's measurement kept beside it)."""
        out = dict(self.out)
        out["paired"] = paired_ratios(out["open"], out["refs"])
        if self.args.rounds > 1:
            out["points_rounds"], out["open_rounds"] = out["points"], out["open"]
            out["points"] = per_point(out["points"], "concurrency")
            out["open"] = per_point(out["open"], "factor")
            out["refs_rounds"], out["refs"] = out["refs"], per_point(out["refs"], "factor")
        return out


def server_rejects(srv: ServerProc) -> dict[str, Any]:
    """503s as the server timed them (access log: first request byte to last response byte, in the app)."""
    got = server_log(srv.log(1 << 30)).get("POST /v1/tts 503", {})
    return {"count": got.get("count", 0), "p50_ms": got.get("p50_ms"), "p99_ms": got.get("p99_ms")}


def startup_line(srv: ServerProc) -> str | None:
    """The server's own one-line account of its admission choice."""
    with open(srv.log_path, "rb") as f:  # near the start: the access log follows it
        head = f.read(200_000).decode(errors="replace")
    return next((line.split("admission:", 1)[1].strip() for line in head.splitlines() if "admission:" in line), None)


def run_systems(args: argparse.Namespace, systems: list[str], model_dir: str, run_dir: Path,
                results: dict[str, Any]) -> None:
    """Start ``systems``' servers together and run their phases interleaved, one system at a time, so a host that
    slows down mid-run slows every system's same phase alike; one failing does not lose the others'."""
    with contextlib.ExitStack() as stack:
        runs: dict[str, SystemRun] = {}
        for system in systems:
            log(f"{system}: starting (pool {pool_settings(system, args) or 'defaults'})")
            try:
                srv = stack.enter_context(server(system, args, model_dir, run_dir))
                runs[system] = SystemRun(system, srv, args)
            except Exception as exc:
                fail(results, system, exc)
        plans = {system: run.plan() for system, run in runs.items()}
        for i in range(max((len(p) for p in plans.values()), default=0)):
            for system, _run in turns(runs, plans, i):
                try:
                    asyncio.run(plans[system][i][1]())
                except Exception as exc:
                    fail(results, system, exc)
                    del runs[system]
        for system, run in runs.items():
            results["systems"][system] = {**run.report(), "admission_log": startup_line(run.srv),
                                          "server_503": server_rejects(run.srv)}


def turns(runs: dict[str, SystemRun], plans: dict[str, list[tuple[int, Any]]], i: int) -> list[tuple[str, SystemRun]]:
    """The systems that run phase ``i``, in the order they take it: as given in even rounds, reversed in odd
    ones (ABC CBA ABC), so no system is always the first after another's phase, or the last."""
    present = [(system, run) for system, run in runs.items() if i < len(plans[system])]
    odd = any(plans[system][i][0] % 2 for system, _ in present)
    return present[::-1] if odd else present


def fail(results: dict[str, Any], system: str, exc: BaseException) -> None:
    log(f"  {system} FAILED: {type(exc).__name__}: {str(exc)[:2000]}")
    results["systems"][system] = {"system": system, "failed": f"{type(exc).__name__}: {exc}"[:4000]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.lib.model import ensure_model

    model_dir = args.model_dir or ensure_model(2)
    run_dir, results = start_run("admission", args, log, model=Path(model_dir).name, text=TEXT, systems={})
    with realtime_client(args.client_rt_priority) as scheduling:
        results["load_generator"] = scheduling
        log(f"load generator: {scheduling}")
        for systems in [[s] for s in args.systems] if args.sequential else [args.systems]:
            run_systems(args, systems, model_dir, run_dir, results)
    results["loadavg_end"] = os.getloadavg()
    results["goals"] = admission_goals(results)
    save(args.out, "admission", results, admission_markdown(results))
    print_goals(results["goals"])
    return 0
