"""``make loadtest``: a local cosyserve on the tiny model, driven by locust headless (bench/README.md).

    python -m bench serve --scenario loadtest [--users 8] [--run-time 60s] [--workers 2] [--max-queue 8]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.lib.model import ensure_model
from bench.lib.procs import ROOT, ServerProc


def parse_duration(text: str) -> float:
    """Locust's run-time syntax, e.g. 60s, 2m, 1h30m, 90."""
    total, num = 0.0, ""
    for ch in text.strip():
        if ch.isdigit() or ch == ".":
            num += ch
        else:
            total += float(num or 0) * {"s": 1, "m": 60, "h": 3600}[ch]
            num = ""
    return total + float(num or 0)


def locust_argv(locustfile: Path, host: str, users: int, spawn_rate: float, run_time: str, csv_prefix: Path,
                html: Path | None = None, json_file: Path | None = None) -> list[str]:
    argv = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", str(users),
            "-r", str(spawn_rate), "--run-time", run_time, "--host", host, "--csv", str(csv_prefix),
            "--only-summary", "--stop-timeout", "30", "--exit-code-on-error", "0"]
    if html is not None:
        argv += ["--html", str(html)]
    if json_file is not None:
        argv += ["--json-file", str(json_file)]  # locust appends ".json"
    return argv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", "-u", type=int, default=int(os.environ.get("LOADTEST_USERS", "8")))
    ap.add_argument("--spawn-rate", "-r", type=float, default=None, help="default: all users at once")
    ap.add_argument("--run-time", default=os.environ.get("LOADTEST_RUN_TIME", "60s"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-queue", type=int, default=8)
    ap.add_argument("--model-dir", help="default: the tiny CosyVoice2 model, built once into the cache")
    ap.add_argument("--fake", action="store_true", help="serve the fake engine (a tone) instead of a model")
    ap.add_argument("--reports", default=".cache/bench/loadtest", help="output dir (default .cache/bench/loadtest)")
    args = ap.parse_args(argv)

    reports = (ROOT / args.reports).resolve()
    reports.mkdir(parents=True, exist_ok=True)
    engine: dict = {} if args.fake else {"model_dir": args.model_dir or ensure_model(2), "torch_threads": 1}
    config = {"server": {"log_level": "warning", "drain_timeout_s": 10}, "engine": engine,
              "dev": {"fake_engine": bool(args.fake)},
              "pool": {"workers": args.workers, "max_queue": args.max_queue, "request_timeout_s": 120},
              "voices": {"dir": str(reports / "loadtest-voices")}}
    server = ServerProc("loadtest-server", config, reports)
    csv_prefix = reports / "loadtest"
    spawn = args.spawn_rate or args.users
    print(f"loadtest: starting cosyserve ({'fake engine' if args.fake else engine['model_dir']}) on {server.base_url}",
          flush=True)
    with server:
        cmd = locust_argv(ROOT / "locustfiles" / "locustfile.py", server.base_url, args.users, spawn, args.run_time,
                          csv_prefix, reports / "loadtest.html", reports / "loadtest")
        print(f"loadtest: {args.users} users for {args.run_time}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, check=False, cwd=ROOT, timeout=parse_duration(args.run_time) + 120).returncode
        except subprocess.TimeoutExpired:
            print("loadtest: locust did not finish in time; stopped", file=sys.stderr)
            rc = 124
        elapsed = time.monotonic() - t0
        metrics = _metrics_excerpt(server.base_url)
    print(f"loadtest: locust ran {elapsed:.0f} s (exit {rc}; its summary above: response times in ms, TTFA rows, "
          f"503s as \"rejected ...\"); server stopped with exit code {server.proc.returncode if server.proc else '?'}")
    if metrics:
        print("\nserver /metrics at the end:\n" + metrics)
    print(f"\nreports: {csv_prefix}_stats.csv, {reports / 'loadtest.html'}, {reports / 'loadtest.json'}")
    return 0 if rc == 0 else rc


def _metrics_excerpt(base_url: str) -> str:
    import httpx

    try:
        text = httpx.get(base_url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return ""
    keep = ("tts_requests_total", "tts_rejected_total", "tts_engine_errors_total", "tts_process_peak_rss_bytes")
    return "\n".join(line for line in text.splitlines()
                     if line.startswith(keep) and not line.rstrip().endswith(" 0.0"))
