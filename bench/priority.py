"""Live and bulk on one server: a bulk backlog beside a steady interactive load (issue 39).

    python -m bench serve --scenario priority [--quick] [--model-dir DIR] [--out DIR]      (make bench-priority)

Phases A (interactive alone), B (beside the backlog), A2 (alone again), C (the backlog alone) and
the goals: docs/benchmarks/README.md, "(h) Live and bulk on one server", and docs/priority.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from bench.lib import load
from bench.lib.admission_server import TEXT, Poller, pool_server
from bench.lib.admission_server import work as spec
from bench.lib.load import LoadClient, Result
from bench.lib.procs import SuiteParser, logger, start_run
from bench.report import (
    backlog_summary,
    best_closed,
    limit_readings,
    ms,
    print_goals,
    priority_goals,
    priority_markdown,
    priority_table,
    save,
)

log = logger("priority")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = SuiteParser(__doc__, "priority", quick="smoke run: short phases, a small backlog (numbers meaningless)")
    ap.add_argument("--concurrency", help="closed-loop sweep for the knee (default 1,2,4,8; --quick 1,2)")
    ap.add_argument("--phase-s", type=float, help="measured seconds of the interactive loop (default 60; --quick 6)")
    ap.add_argument("--point-s", type=float, help="measured seconds per sweep point (default 20; --quick 3)")
    ap.add_argument("--warmup-s", type=float, help="unmeasured seconds before each loop (default 5; --quick 1)")
    ap.add_argument("--backlog", type=int, help="bulk requests submitted at once (default 200; --quick 12)")
    ap.add_argument("--server-nice", type=int, default=5, help="run the server at this niceness (0: as the client)")
    ap.add_argument("--clients", type=int, help="interactive clients in A, B, A2 (default: the knee's limit)")
    args = ap.parse(argv, quick={"concurrency": "1,2", "phase_s": 6.0, "point_s": 3.0, "warmup_s": 1.0, "backlog": 12},
                    full={"concurrency": "1,2,4,8", "phase_s": 60.0, "point_s": 20.0, "warmup_s": 5.0, "backlog": 200})
    args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    if not args.concurrency or args.backlog < 1:
        ap.error("--concurrency needs a value and --backlog at least 1")
    return args


def bulk_timeout_s() -> float:
    """The class timeout the server runs with on the defaults (``pool.bulk_queue_timeout_s``)."""
    from app.settings import PoolSettings

    return float(PoolSettings.model_fields["bulk_queue_timeout_s"].default)


def interactive(s: load.Summary) -> dict[str, Any]:
    return {**s.to_dict(), "failed": s.errors + s.timeouts}


async def backlog(url: str, n: int, timeout_s: float) -> list[Result]:
    """``n`` bulk requests sent at once, each awaited to its end."""
    async with LoadClient(url, timeout_s, max_connections=n + 8) as lc:
        return list(await asyncio.gather(*(lc.send(spec("bulk")) for _ in range(n))))


def closed(url: str, c: int, seconds: float, args: argparse.Namespace) -> Coroutine[Any, Any, load.Summary]:
    """``c`` interactive clients for ``seconds``, honouring each 503's Retry-After."""
    return load.closed_loop(url, spec(), c, seconds, warmup_s=args.warmup_s, timeout_s=args.timeout_s,
                            reject_backoff_s=None)


async def knee(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The closed-loop sweep: each point's summary and the admission limit it settled on."""
    await load.fixed_count(url, spec(), 4, 2, args.timeout_s)  # allocator, caches: not measured
    points = []
    for c in args.concurrency:
        with Poller(url, time.monotonic()) as poll:
            s = await closed(url, c, args.point_s, args)
        points.append({"concurrency": c, **s.to_dict(), "limit_last": poll.limits[-1] if poll.limits else None})
        log(f"  c={c}: {s.throughput_rps:.2f} rps {s.audio_per_s:.1f} audio-s/s p99={ms(s.latency_p99_s, 0, ' ms')} "
            f"503={s.rejected} limit={points[-1]['limit_last']}")
    best = best_closed(points)
    limit = best["limit_last"]
    # the knee's closed loop: as many clients as the limit the server settled on (the sweep's best point
    # when no limit was read); a best point past the limit only adds clients waiting in its waiting room
    knee_c = max(1, round(limit)) if limit else best["concurrency"]
    return {"concurrency": knee_c, "best_concurrency": best["concurrency"], "best_audio_per_s": best["audio_per_s"],
            "limit": limit, "swept": args.concurrency, "points": points}


async def loop(url: str, c: int, args: argparse.Namespace, bulk_timeout: float | None = None) -> dict[str, Any]:
    """The interactive closed loop of ``c`` clients, with the admission limit it ran under; ``bulk_timeout``:
    beside the backlog, submitted as its measured window opens (phase B)."""
    t0 = time.monotonic()
    with Poller(url, t0) as poll:
        looping = asyncio.create_task(closed(url, c, args.phase_s, args))
        if bulk_timeout is not None:
            await asyncio.sleep(args.warmup_s)
            bulk = asyncio.create_task(backlog(url, args.backlog, bulk_timeout + args.timeout_s))
        s = await looping
    out: dict[str, Any] = {"interactive": interactive(s)}
    if bulk_timeout is not None:
        out["bulk"] = backlog_summary(await bulk, (t0 + args.warmup_s, t0 + args.warmup_s + args.phase_s))
    return {**out, "limit": limit_readings(poll.limits)}


async def measure(url: str, args: argparse.Namespace, results: dict[str, Any]) -> None:
    log(f"knee: closed loop at {args.concurrency}")
    results["knee"] = k = await knee(url, args)
    c = args.clients or k["concurrency"]
    results["clients"] = c
    log(f"A: {c} interactive clients alone, {args.phase_s:g} s")
    results["phases"]["A"] = await loop(url, c, args)
    log(f"B: {c} interactive clients beside {args.backlog} bulk requests")
    results["phases"]["B"] = await loop(url, c, args, results["bulk_timeout_s"])
    log(f"A2: {c} interactive clients alone again (the host's drift across B)")
    results["phases"]["A2"] = await loop(url, c, args)
    log(f"C: {args.backlog} bulk requests alone")
    bulk = await backlog(url, args.backlog, results["bulk_timeout_s"] + args.timeout_s)
    results["phases"]["C"] = {"bulk": backlog_summary(bulk)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.lib.model import ensure_model

    model_dir = args.model_dir or ensure_model(2)
    run_dir, results = start_run("priority", args, log, model=Path(model_dir).name, text=TEXT, phase_s=args.phase_s,
                                 backlog=args.backlog, bulk_timeout_s=bulk_timeout_s(), phases={})
    with pool_server("defaults", {}, args.server_nice, model_dir, run_dir) as srv:
        try:
            asyncio.run(measure(srv.base_url, args, results))
        except Exception as exc:
            log(f"FAILED: {type(exc).__name__}: {str(exc)[:2000]}")
            results["failed"] = f"{type(exc).__name__}: {exc}"[:4000]
    results["loadavg_end"] = os.getloadavg()
    results["goals"] = priority_goals(results)
    save(args.out, "priority", results, priority_markdown(results))
    print("\n" + priority_table(results))
    print_goals(results["goals"])
    return 0 if "failed" not in results else 1
