"""A replay of repeated prompts with a popularity skew, the answer cache off, on, and on tight budgets.

    python -m bench serve --scenario cache   # writes .cache/bench/cache/cache.md (method: bench/README.md)
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.lib.procs import SuiteParser, cosyserve, machine, tiny_config
from bench.lib.prom import scrape
from bench.report import save, table

COMMAND = ".venv/bin/python -m bench serve --scenario cache"
SUBJECTS = ("your order", "the train to Paris", "your appointment", "the package", "flight 42", "the meeting",
            "your table", "the next bus", "your refund", "the elevator")
STATES = ("is on its way", "has been delayed by ten minutes", "is ready", "was cancelled", "arrives at platform two",
          "starts in five minutes", "needs your confirmation", "is now boarding", "has been moved to Friday",
          "is complete", "is waiting for you at the front desk", "will be ready tomorrow morning",
          "has arrived", "is running late", "is confirmed", "was rescheduled", "is out for delivery",
          "is being prepared", "is closed today", "will call you back")


def dir_bytes(path: Path | None) -> int:
    total = 0
    for f in path.rglob("*") if path and path.is_dir() else ():
        with contextlib.suppress(OSError):  # removed while we looked
            total += f.stat().st_size if f.is_file() else 0
    return total


def sample_cache(base: str, stop: threading.Event, peak: dict, cache_dir: Path | None = None) -> None:
    """Every second until ``stop``, and once more then: the largest cache bytes seen per tier (and on disk)."""
    while True:
        stopped = stop.wait(1.0)
        peak["dir"] = max(peak.get("dir", 0), dir_bytes(cache_dir))
        try:
            m = scrape(base, labels=True, timeout=5)
        except httpx.HTTPError:
            continue
        for tier in ("memory", "disk"):
            peak[tier] = max(peak.get(tier, 0.0), m.get(f'tts_cache_bytes{{tier="{tier}"}}', 0.0))
            peak[f"{tier}_budget"] = m.get(f'tts_cache_budget_bytes{{tier="{tier}"}}', 0.0)
            peak[f"{tier}_evicted"] = m.get(f'tts_cache_evictions_total{{tier="{tier}"}}', 0.0)
        if stopped:
            return


async def replay(base: str, lines: list[str], draws: list[int], clients: int, seed: int = 1) -> dict:
    queue = list(reversed(draws))
    latencies: list[float] = []
    stats = {"audio_s": 0.0, "hits": 0, "refused": 0, "errors": 0}

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            line = lines[queue.pop()]
            t0 = time.perf_counter()
            while True:
                r = await http.post("/v1/tts", json={"text": line, "seed": seed, "format": "wav"})
                if r.status_code != 503:
                    break
                stats["refused"] += 1
                await asyncio.sleep(0.05)
            if r.status_code != 200:
                stats["errors"] += 1
                continue
            latencies.append(time.perf_counter() - t0)
            stats["audio_s"] += (len(r.content) - 44) / 2 / int(r.headers["x-sample-rate"])
            stats["hits"] += r.headers.get("x-cache") == "hit"

    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=base, timeout=300) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    wall = time.perf_counter() - t0
    latencies.sort()
    return {**stats, "wall_s": wall, "n": len(latencies), "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}


def run(label: str, cache: dict, clients: int, lines: list[str], draws: list[int], tmp: Path) -> dict:
    cfg = tiny_config(tmp, engine={"torch_threads": 1}, cache=cache)
    with cosyserve(f"cache-{label}", cfg, tmp) as srv:
        base = srv.base_url
        asyncio.run(replay(base, lines, draws[:8], 1, seed=0))  # warm-up: another seed, so nothing it stores is hit
        cpu0 = scrape(base).get("process_cpu_seconds_total", 0.0)
        stop, peak = threading.Event(), {}
        cache_dir = Path(cache["dir"]) if cache.get("dir") else None
        sampler = threading.Thread(target=sample_cache, args=(base, stop, peak, cache_dir), daemon=True)
        sampler.start()
        result = asyncio.run(replay(base, lines, draws, clients))
        stop.set()
        sampler.join()
        cpu1 = scrape(base).get("process_cpu_seconds_total", 0.0)
    return {**result, "cpu_s": cpu1 - cpu0, "peak": peak}


def main(argv: list[str] | None = None) -> None:
    ap = SuiteParser(__doc__, "cache", server=False)
    ap.add_argument("--lines", type=int, default=200, help="distinct prompts")
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of their popularity")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--tight-mb", type=float, default=2.0, help="both tiers' budget in the third run (0: no such run)")
    args = ap.parse(argv)
    every = [f"{s.capitalize()} {v}." for v in STATES for s in SUBJECTS]
    assert args.lines <= len(every), f"at most {len(every)} distinct lines"
    lines, weights = every[: args.lines], [1.0 / (rank + 1) ** args.zipf for rank in range(args.lines)]
    draws = random.Random(0).choices(range(args.lines), weights=weights, k=args.requests)  # Zipf popularity
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("off", {"enabled": False}), ("on", {})]
        if args.tight_mb:
            tight = {"memory_mb": args.tight_mb, "disk_mb": args.tight_mb, "dir": str(Path(tmp) / "answers")}
            runs.append(("tight", tight))
        for label, cache in runs:
            rows[label] = run(label, cache, args.clients, lines, draws, Path(tmp))
            print(label, rows[label], flush=True)
    off, on = rows["off"], rows["on"]
    lines_md = [
        (f"# Answer cache: {args.requests} seeded requests over {args.lines} lines (Zipf s={args.zipf:g}), "
        f"{args.clients} clients"),
        "",
        (f"Command: `{COMMAND} --lines {args.lines} --zipf {args.zipf:g} --requests {args.requests} "
        f"--clients {args.clients} --tight-mb {args.tight_mb:g}` (tiny random-weight CosyVoice2, defaults; off: "
        f"`cache.enabled: false`; tight: `cache.memory_mb` and `cache.disk_mb` {args.tight_mb:g}, `cache.dir` set)"),
        f"{machine()} Distinct lines drawn: {len(set(draws))}.",
        "",
        *table(["cache", "audio s / wall s", "p50 (s)", "p99 (s)", "hit rate", "server CPU s", "503 retried", "errors",
                "peak memory tier (MB) / budget"],
               [[label, f"{r['audio_s'] / r['wall_s']:.2f}", f"{r['p50']:.3f}", f"{r['p99']:.3f}",
                 f"{r['hits'] / max(1, r['n']):.1%}", f"{r['cpu_s']:.1f}", r["refused"], r["errors"],
                 f"{r['peak'].get('memory', 0) / 2**20:.2f} / {r['peak'].get('memory_budget', 0) / 2**20:g}"]
                for label, r in rows.items()]),
    ]
    if "tight" in rows:
        mb, t = 2**20, rows["tight"]["peak"]
        held = max(t.get("memory", 0) / max(1, t.get("memory_budget", 0)),
                   max(t.get("disk", 0), t.get("dir", 0)) / max(1, t.get("disk_budget", 0)))
        lines_md += ["", *table(["tight run", "memory tier peak / budget (MB)", "disk tier peak / budget (MB)",
                                 "directory's files peak (MB)", "evicted memory / disk"],
                                [["tight", f"{t.get('memory', 0) / mb:.2f} / {t.get('memory_budget', 0) / mb:.2f}",
                                  f"{t.get('disk', 0) / mb:.2f} / {t.get('disk_budget', 0) / mb:.2f}",
                                  f"{t.get('dir', 0) / mb:.2f}",
                                  f"{t.get('memory_evicted', 0):.0f} / {t.get('disk_evicted', 0):.0f}"]]),
                     "", f"Largest peak against its budget in the tight run: **{held:.2f}x** (goal <= 1)."]
    speedup = (on["audio_s"] / on["wall_s"]) / max(1e-9, off["audio_s"] / off["wall_s"])
    lines_md += ["", (f"Throughput on / off: **{speedup:.2f}x** at a {on['hits'] / max(1, on['n']):.1%} hit rate; "
                 f"p99 {on['p99']:.3f} s vs {off['p99']:.3f} s; "
                 f"server CPU {on['cpu_s']:.1f} s vs {off['cpu_s']:.1f} s.")]
    print("\n".join(lines_md))
    save(args.out, "cache", None, "\n".join(lines_md) + "\n")
