"""The headline suite (~10 min; ``make bench`` runs admission, batching and cost after it): on the tiny CosyVoice2,
(a) the ceilings in-process, then (b) cosyserve ((c)-(f) left after 5983ddc). Method and goals:
docs/benchmarks/README.md, "The headline suite"."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.lib import load
from bench.lib.admission_server import TEXT, work
from bench.lib.load import RequestSpec
from bench.lib.model import ensure_model
from bench.lib.procs import (
    ROOT,
    THREAD_ENV,
    ServerProc,
    SuiteParser,
    logger,
    shown,
    start_run,
)
from bench.report import print_goals, run_goals, run_markdown, save

SHORT_TEXT = "Hello there."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = SuiteParser(__doc__, "run", quick="smoke run: a few seconds per point (numbers meaningless)")
    ap.add_argument("--systems", default="ceilings,cosyserve", help="comma list of: ceilings, cosyserve")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--point-s", type=float, help="measured seconds per closed-loop point")
    ap.add_argument("--warmup-s", type=float, help="unmeasured seconds before each point")
    ap.add_argument("--overload-s", type=float, help="seconds of open-loop arrivals")
    ap.add_argument("--overload-factor", type=float, default=3.0)
    ap.add_argument("--streams", type=int, help="sequential streams for the TTFA series")
    ap.add_argument("--rss-requests", type=int, help="requests in the memory run")
    ap.add_argument("--rss-warmup", type=int, help="requests before the memory run's baseline")
    ap.add_argument("--reject-backoff-s", type=float, default=0.1, help="closed-loop client pause after a 503")
    ap.add_argument("--workers", type=int, default=2,
                    help="ceiling threads and the client concurrency of warm-up and memory runs")
    ap.add_argument("--server-workers", type=int, default=None,
                    help="cosyserve pool.workers (default: none, the server's own default, as a user starts it)")
    ap.add_argument("--max-queue", type=int, default=None, help="cosyserve pool.max_queue (default: the server's)")
    ap.add_argument("--max-rss-gb", type=float, default=10.0,
                    help="kill a server whose process tree grows past this (protects the machine); 0: no limit")
    args = ap.parse(argv, quick={"point_s": 3.0, "warmup_s": 1.0, "overload_s": 4.0, "streams": 10,
                                 "rss_requests": 40, "rss_warmup": 10},
                    full={"point_s": 15.0, "warmup_s": 3.0, "overload_s": 20.0, "streams": 100,
                          "rss_requests": 2000, "rss_warmup": 100})
    args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    return args


log = logger("bench")


def run_ceiling(args: argparse.Namespace, model_dir: str) -> dict:
    argv = [sys.executable, "-m", "bench.lib.ceilings", "--model-dir", model_dir, "--text", TEXT,
            "--workers", str(args.workers), "--warmup", str(args.warmup_s), "--duration", str(args.point_s),
            "--streams", str(args.streams)]
    log("(a) ceiling: threads")
    proc = subprocess.run(argv, check=False, cwd=ROOT, env={**os.environ, **THREAD_ENV}, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.lib.ceilings failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


WORK, SHORT = (RequestSpec("POST", "/v1/tts", json={"text": text, "format": "pcm"}) for text in (TEXT, SHORT_TEXT))
STREAM = work()  # the same sentence, streamed


def server(args: argparse.Namespace, model_dir: str, run_dir: Path) -> ServerProc:
    """``cosyserve serve`` as a user starts it: no pool section unless ``--server-workers`` / ``--max-queue``."""
    pool = {k: v for k, v in (("workers", args.server_workers), ("max_queue", args.max_queue)) if v is not None}
    config = {"server": {"log_level": "warning", "drain_timeout_s": 10},
              "engine": {"model_dir": model_dir, "torch_threads": 1}, "voices": {"dir": str(run_dir / "voices")},
              "metrics": {"enabled": True}, **({"pool": pool} if pool else {})}
    return ServerProc("cosyserve", config, run_dir, rss_limit_bytes=int(args.max_rss_gb * 2**30))


async def bench_system(srv: ServerProc, args: argparse.Namespace) -> dict[str, Any]:
    url, rss = srv.base_url, srv.rss
    out: dict[str, Any] = {"label": "(b) cosyserve", "points": [], "rss_at_ready": rss.now()}
    warm = await load.fixed_count(url, WORK, 2 * args.workers, args.workers, args.timeout_s)  # not measured
    bad = [r for r in warm if r.kind != "ok"]
    if bad:
        raise RuntimeError(f"warm-up requests failed: {[(r.kind, r.status) for r in bad]}\n{srv.log()}")
    for c in args.concurrency:
        if rss.limit_hit:
            break
        t0 = rss.elapsed()
        s = await load.closed_loop(url, WORK, c, args.point_s, warmup_s=args.warmup_s,
                                   timeout_s=args.timeout_s, reject_backoff_s=args.reject_backoff_s)
        out["points"].append({"kind": "closed", "concurrency": c, **s.to_dict(), "peak_rss": rss.peak(t0)})
        log(f"  c={c}: {s.brief()}")
    if rss.limit_hit:
        out["stopped"] = "RSS limit"
        return out
    capacity = max((p["throughput_rps"] for p in out["points"]), default=0.0)
    rate = max(0.1, args.overload_factor * capacity)
    t0 = rss.elapsed()
    s = await load.open_loop(url, WORK, rate, args.overload_s, timeout_s=args.timeout_s)
    out["overload"] = {"kind": "open", "rate_rps": rate, "capacity_rps": capacity, **s.to_dict(),
                       "peak_rss": rss.peak(t0)}
    log(f"  open loop {rate:.2f}/s ({args.overload_factor:g}x {capacity:.2f}): {s.brief()}")
    if not rss.limit_hit:
        await ttfa_series(url, args, out)
        await memory_run(srv, args, out)
    out["peak_rss"] = rss.peak()
    return out


async def ttfa_series(url: str, args: argparse.Namespace, out: dict) -> None:
    results = await load.fixed_count(url, STREAM, args.streams, 1, args.timeout_s)  # one after another
    out["ttfa_series"] = [r.ttfa_s for r in results]
    out["ttfa_kinds"] = [r.kind for r in results]
    out["ttfa"] = load.summarize(results, 1.0).to_dict()
    log(f"  {args.streams} sequential streams: ttfa p50 {1000 * (out['ttfa']['ttfa_p50_s'] or 0):.0f}ms")


async def memory_run(srv: ServerProc, args: argparse.Namespace, out: dict) -> None:
    """RSS after ``rss_warmup`` short requests vs after ``rss_requests`` more (concurrency = workers)."""
    await load.fixed_count(srv.base_url, SHORT, args.rss_warmup, args.workers, args.timeout_s)
    before = await stable_rss(srv)
    t0 = srv.rss.elapsed()
    results = await load.fixed_count(srv.base_url, SHORT, args.rss_requests, args.workers, args.timeout_s)
    after = await stable_rss(srv)
    kinds = {k: sum(r.kind == k for r in results) for k in ("ok", "rejected", "timeout", "error")}
    out["memory"] = {"warmup_requests": args.rss_warmup, "requests": args.rss_requests, "rss_before": before,
                     "rss_after": after, "growth": after / before - 1 if before else None, "outcomes": kinds,
                     "peak_rss": srv.rss.peak(t0)}
    log(f"  memory: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB over {args.rss_requests} "
        f"requests ({kinds})")


async def stable_rss(srv: ServerProc) -> int:
    """Median of a few samples, 0.2 s apart (RSS jitters by a page or two)."""
    vals = []
    for _ in range(5):
        vals.append(srv.rss.now())
        await asyncio.sleep(0.2)
    return sorted(vals)[len(vals) // 2]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    model_dir = args.model_dir or ensure_model(2)
    run_dir, results = start_run("run", args, log, model_dir=shown(model_dir), text=TEXT, short_text=SHORT_TEXT,
                                 systems={})
    if "ceilings" in args.systems:
        try:
            results["ceiling_threads"] = run_ceiling(args, model_dir)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            log(f"  ceiling FAILED: {str(exc)[:2000]}")
    if "cosyserve" in args.systems:
        log("(b) cosyserve: starting")
        srv = server(args, model_dir, run_dir)
        try:
            with srv:  # stopped (SIGTERM, then SIGKILL of its group) whatever happens inside
                b = asyncio.run(bench_system(srv, args))
        except Exception as exc:
            log(f"  cosyserve FAILED: {type(exc).__name__}: {str(exc)[:2000]}")
            b = {"label": "(b) cosyserve", "points": [], "failed": f"{type(exc).__name__}: {exc}"[:4000]}
        results["systems"]["cosyserve"] = b
        b["exit_code"] = srv.proc.returncode if srv.proc else None
        if srv.rss is not None and srv.rss.limit_hit:
            b["rss_limit_hit"] = True
            log(f"  KILLED at the RSS limit ({args.max_rss_gb:g} GiB); the rest of its points were skipped")
    results["elapsed_s"] = time.monotonic() - started
    results["loadavg_end"] = os.getloadavg()
    results["goals"] = run_goals(results)
    save(args.out, "run", results, run_markdown(results))
    print_goals(results["goals"])
    log(f"done in {results['elapsed_s'] / 60:.1f} min")
    return 0
