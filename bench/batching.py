"""Continuous LLM batching: the per-request pool vs the batched LLM, full-size and tiny CosyVoice2.

    python -m bench serve --scenario batching [--models full,tiny] [--quick] [--out DIR]     # or: make bench-batching

The systems, points and goals: docs/benchmarks/README.md, "Batching benchmark".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx

from bench.lib import load, prom
from bench.lib.batching_plan import (
    SAMPLE_RATE,
    ModelPlan,
    SystemSpec,
    describe,
    estimate_s,
    plan_for,
    systems,
)
from bench.lib.load import RequestSpec, Result
from bench.lib.model import FULL_DIR
from bench.lib.procs import ServerProc, cosyserve, logger, results_dir, shown, start_run
from bench.report import (
    batching_goals,
    batching_markdown,
    batching_point_summary,
    print_goals,
    save,
)

log = logger("batching")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="comma list of full, tiny (default: full,tiny; --quick: tiny)")
    ap.add_argument("--quick", action="store_true", help="smoke run: a few requests per point (numbers meaningless)")
    ap.add_argument("--out", help="output dir (default .cache/bench/batching; --quick: .cache/bench/batching/quick)")
    ap.add_argument("--full-dir", default=str(FULL_DIR), help="full-size model dir (built there if missing)")
    ap.add_argument("--tiny-dir", help="default: the tiny CosyVoice2 model of bench/lib/model.py")
    ap.add_argument("--systems", default="per_request,batched", help="comma list of per_request, batched")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--stream-concurrency", help="streaming levels (default: full 1,4,8; tiny all; --quick 1,8)")
    ap.add_argument("--batched-workers", type=int, default=16, help="pool.workers of the batched system")
    ap.add_argument("--max-batch-size", type=int, default=16, help="engine.max_batch_size of the batched system")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="client and server request timeout")
    ap.add_argument("--max-rss-gb", type=float, default=16.0, help="kill a server growing past this; 0: no limit")
    args = ap.parse_args(argv)
    args.models = [m.strip() for m in (args.models or ("tiny" if args.quick else "full,tiny")).split(",") if m.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.concurrency = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
    args.stream_concurrency = (tuple(int(c) for c in args.stream_concurrency.split(",") if c.strip())
                               if args.stream_concurrency else None)
    args.out = Path(args.out) if args.out else results_dir("batching", args.quick)
    return args


def model_dir(model: str, args: argparse.Namespace) -> str:
    from bench.lib.model import ensure_full_model, ensure_model

    if model == "tiny":
        return args.tiny_dir or ensure_model(2)
    return ensure_full_model(args.full_dir)


def spec(text: str, stream: bool) -> RequestSpec:
    body: dict[str, Any] = {"text": text, "format": "pcm", "sample_rate": SAMPLE_RATE}
    if stream:
        body["stream"] = True
    return RequestSpec("POST", "/v1/tts", json=body)


async def run_point(url: str, req: RequestSpec, concurrency: int, count: int, cap_s: float,
                    timeout_s: float) -> tuple[list[Result], float, bool]:
    """``count`` requests from ``concurrency`` closed-loop clients; none starts after ``cap_s``. (results, wall
    seconds from the first send to the last byte, whether the cap cut the point short)"""
    t0 = time.monotonic()
    results = await load.fixed_count(url, req, count, concurrency, timeout_s, cap_s=cap_s)
    return results, max((r.start + r.latency_s for r in results), default=t0) - t0, len(results) < count


async def metrics(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.get(url + "/metrics")
    return prom.parse_samples(r.text) if r.status_code == 200 else {}


async def bench_system(srv: ServerProc, plan: ModelPlan, args: argparse.Namespace) -> dict[str, Any]:
    url, rss = srv.base_url, srv.rss
    assert rss is not None
    out: dict[str, Any] = {"points": [], "rss_at_ready": rss.now()}
    warm, _, _ = await run_point(url, spec(plan.text, False), 1, plan.warmup, plan.cap_s, args.timeout_s)
    bad = [(r.kind, r.status) for r in warm if r.kind != "ok"]
    if bad:
        raise RuntimeError(f"warm-up requests failed: {bad}\n{srv.log_tail()}")
    for mode, counts in (("nonstream", plan.nonstream), ("stream", plan.stream)):
        for c, n in counts.items():
            before, t_rss = await metrics(url), rss.elapsed()
            results, wall, capped = await run_point(url, spec(plan.text, mode == "stream"), c, n, plan.cap_s,
                                                    args.timeout_s)
            after = await metrics(url)
            p = {"mode": mode, "concurrency": c, "planned": n, "capped": capped,
                 **batching_point_summary(results, wall, SAMPLE_RATE), **prom.llm_deltas(before, after, wall),
                 "peak_rss": rss.peak(t_rss)}
            out["points"].append(p)
            log(f"    {mode} c={c}: {p['ok']}/{n} ok in {wall:.1f}s, {p['audio_s_per_s']:.3f} audio-s/s, "
                f"p50 {_s(p['latency_p50_s'])} ttfa p50 {_s(p['ttfa_p50_s'])}, tok/s {_f(p['llm_tokens_per_s'])}, "
                f"batch {_f(p['llm_batch_mean'])}, RSS {p['peak_rss'] / 2**20:.0f} MiB"
                + (" (capped)" if capped else "") + (f" ERR {p['errors']} TO {p['timeouts']} 503 {p['rejected']}"
                                                     if p["ok"] < len(results) else ""))
            if rss.limit_hit:
                out["stopped"] = "RSS limit"
                return out
    out["peak_rss"] = rss.peak()
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def server(system: SystemSpec, mdir: str, run_dir: Path, plan: ModelPlan, args: argparse.Namespace) -> ServerProc:
    max_queue = 4 * max(args.concurrency)  # closed-loop clients never see a 503
    return cosyserve(f"{plan.key}-{system.key}", system.config(mdir, run_dir, max_queue, args.timeout_s), run_dir,
                     rss_limit_bytes=int(args.max_rss_gb * 2**30))


def write(results: dict[str, Any], out: Path) -> list[dict]:
    goals = batching_goals(results)
    results["goals"] = goals
    save(out, "batching", results, batching_markdown(results, goals))
    return goals


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    plans = [plan_for(m, args.quick, args.concurrency, args.stream_concurrency) for m in args.models]
    chosen = [s for s in systems(args.batched_workers, args.max_batch_size) if s.key in args.systems]
    for plan in plans:
        log("plan " + describe(plan))
    total = sum(estimate_s(p, len(chosen)) for p in plans)
    log(f"estimated {total / 60:.1f} min (pessimistic: every point at the per-request pool's cost)")
    run_dir, results = start_run(
        "batching", args, log, quick=args.quick, sample_rate=SAMPLE_RATE, text=plans[0].text if plans else "",
        plans={p.key: {"nonstream": p.nonstream, "stream": p.stream, "cap_s": p.cap_s} for p in plans}, models={})
    for plan in plans:
        mdir = model_dir(plan.key, args)
        results["models"][plan.key] = {"model_dir": shown(mdir), "systems": {}}
        for system in chosen:
            log(f"{plan.key} / {system.label}: starting")
            srv = server(system, mdir, run_dir, plan, args)
            t0 = time.monotonic()
            entry: dict[str, Any] = {"label": system.label, "batching": system.batching, "workers": system.workers}
            try:
                with srv:  # SIGTERM, then SIGKILL of its group, whatever happens inside
                    entry["load_s"] = time.monotonic() - t0
                    log(f"  ready in {entry['load_s']:.1f}s")
                    entry.update(asyncio.run(bench_system(srv, plan, args)))
            except Exception as exc:  # noqa: BLE001 - one system failing must not lose the others' results
                log(f"  FAILED: {type(exc).__name__}: {str(exc)[:2000]}")
                entry.update(failed=f"{type(exc).__name__}: {exc}"[:4000])
            entry["exit_code"] = srv.proc.returncode if srv.proc else None
            results["models"][plan.key]["systems"][system.key] = entry
            results["elapsed_s"] = time.monotonic() - started
            write(results, args.out)  # after every system: a later crash keeps what was measured
    results["loadavg_end"] = os.getloadavg()
    goals = write(results, args.out)
    print_goals(goals)
    log(f"done in {(time.monotonic() - started) / 60:.1f} min")
    return 0
