"""Open loop against the closed loop next to it, on one server: where open-loop goodput goes.

    python -m bench.probes.overload_pairs [--pool '{"workers": 2, "max_queue": 2, "admission": "fixed"}']
        [--clients 8] [--rates 9,18] [--pairs 3] [--model-dir DIR]

One ``cosyserve serve`` (the tiny CosyVoice2 model unless ``--model-dir``; no pool settings unless
``--pool``), then ``--pairs`` times: a closed loop of ``--clients`` clients (25 s after 5 s), then an
open loop (Poisson, 30 s) at each of ``--rates`` requests/s, each phase right after the other, so
the host's drift (this one's speed moves by a third within minutes) hits the closed loop and the
open loop next to it alike. Per phase: goodput, admitted latency, 503s, the server's and the load
generator's CPU (cores), and from ``/metrics`` every 0.25 s the admission limit and the requests in
flight (how often a place sat idle: fewer in flight than the limit). The admission suite's request (bench/lib/admission_server.py), clients and scheduling.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.lib import load
from bench.lib.admission_report import paired_ratios
from bench.lib.admission_server import Poller, pool_server, work
from bench.lib.model import ensure_model
from bench.lib.procs import ServerProc
from bench.lib.sched import realtime_client


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", default="{}", help="the server's pool section, JSON (default: none, as a user starts it)")
    ap.add_argument("--clients", type=int, default=8, help="closed-loop clients")
    ap.add_argument("--rates", default="9,18", help="open-loop arrival rates, requests/s, comma list")
    ap.add_argument("--pairs", type=int, default=3, help="rounds of closed then open loop")
    ap.add_argument("--closed-s", type=float, default=25.0)
    ap.add_argument("--open-s", type=float, default=30.0)
    ap.add_argument("--model-dir", help="default: the tiny CosyVoice2 model of bench/lib/model.py")
    args = ap.parse_args(argv)
    args.pool = json.loads(args.pool)
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    return args


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def shares(values: list[Any]) -> str:
    """``value: share`` of a gauge's readings, by value."""
    counts = collections.Counter(values)
    return ", ".join(f"{v:g}: {n / len(values):.0%}" for v, n in sorted(counts.items())) if values else "-"


async def phase(srv: ServerProc, kind: str, value: float, args: argparse.Namespace) -> dict[str, Any]:
    me, server = psutil.Process(), psutil.Process(srv.proc.pid)
    s0, c0, t0 = cpu_s(server), cpu_s(me), time.monotonic()
    with Poller(srv.base_url, t0, every_s=0.25) as poll:
        if kind == "closed":
            s = await load.closed_loop(srv.base_url, work(), int(value), args.closed_s, warmup_s=5.0,
                                       reject_backoff_s=None)
        else:
            s = await load.open_loop(srv.base_url, work(), value, args.open_s)
    wall = time.monotonic() - t0
    read = [g for g in poll.series if g.get("limit") is not None and g.get("in_flight") is not None]
    return {"kind": kind, "value": value, **s.to_dict(), "server_cores": (cpu_s(server) - s0) / wall,
            "client_cores": (cpu_s(me) - c0) / wall, "limits": [g["limit"] for g in read],
            "in_flight": [int(g["in_flight"]) for g in read]}


def line(p: dict[str, Any]) -> str:
    name = f"closed c={p['value']:g}" if p["kind"] == "closed" else f"open {p['value']:g}/s"
    lat = f"p50 {p['latency_p50_s'] * 1000:.0f} p99 {p['latency_p99_s'] * 1000:.0f} ms" if p["latency_p50_s"] else "-"
    idle = sum(1 for n, lim in zip(p["in_flight"], p["limits"], strict=True) if n < lim) / max(1, len(p["limits"]))
    return (f"{name:>13}: {p['throughput_rps']:.2f} req/s, {lat}, 503s {p['rejected']}, server "
            f"{p['server_cores']:.2f} cores, load generator {p['client_cores']:.2f}; limit {shares(p['limits'])}; "
            f"in flight {shares(p['in_flight'])} (under the limit: {idle:.0%} of readings)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = args.model_dir or ensure_model()
    run_dir = Path(tempfile.mkdtemp(prefix="overload-pairs-"))
    phases: list[dict[str, Any]] = []
    with realtime_client(1) as sched, pool_server("server", args.pool, 5, model, run_dir) as srv:
        print(f"pool {args.pool or '(no settings)'}; load generator {sched}; logs {run_dir}", flush=True)
        asyncio.run(load.fixed_count(srv.base_url, work(), 4, 2))  # warm-up, not measured
        for i in range(args.pairs):
            for kind, value in [("closed", float(args.clients))] + [("open", r) for r in args.rates]:
                p = asyncio.run(phase(srv, kind, value, args))
                phases.append(p)
                print(f"pair {i + 1} {line(p)}", flush=True)
    # each open loop against the closed loop of its pair (the one just before it)
    opened, before = [], []
    for p in phases:
        if p["kind"] == "closed":
            closed = p
        else:
            opened.append({"factor": p["value"], "throughput_rps": p["throughput_rps"]})
            before.append({"factor": p["value"], "throughput_rps": closed["throughput_rps"]})
    loops = " / ".join(f"{p['throughput_rps']:.2f}" for p in phases if p["kind"] == "closed")
    for pair in paired_ratios(opened, before):
        print(f"open {pair['factor']:g}/s over the closed loop just before it: "
              f"{' / '.join(f'{r:.2f}' for r in pair['ratios'])} (median {pair['median']:.2f}); closed loop {loops}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
