"""Memory under mixed traffic for a given time: RSS growth per hour after a warm-up.

    python -m bench serve --scenario soak [--minutes 70 --warmup 10 --clients 4]   # method: bench/README.md
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np
import psutil
import soundfile as sf
from websockets.sync.client import connect

from bench.lib.procs import ServerProc, SuiteParser, machine, tiny_config
from bench.lib.prom import scrape
from bench.report import save, table

COMMAND = ".venv/bin/python -m bench serve --scenario soak"
FORMATS = ("wav", "mp3", "opus", "aac", "flac", "pcm")
WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing about rain and "
         "the long road home past 12 old houses at 3:45 pm on a cold winter evening").split()
METRICS = ("tts_stream_buffered_bytes", "tts_body_buffered_bytes", "tts_cache_bytes", "process_heap_bytes")


def text(rng: random.Random) -> str:
    n = rng.choice((3, 8, 20, 45, 90))
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + rng.choice((".", "!", "?"))


def prompt_wav(rng: random.Random) -> bytes:
    seconds = rng.uniform(2.0, 6.0)
    t = np.arange(int(seconds * 16000)) / 16000
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * rng.uniform(120, 260) * t), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def one_request(http: httpx.Client, ws_url: str, rng: random.Random) -> str:
    kind = rng.choice(("whole", "stream", "cut", "upload", "library", "openai", "ws"))
    fmt = rng.choice(FORMATS)
    if kind == "whole":
        r = http.post("/v1/tts", json={"text": text(rng), "format": fmt})
    elif kind in ("stream", "cut"):
        with http.stream("POST", "/v1/tts", json={"text": text(rng), "format": fmt, "stream": True}) as r:
            for i, _ in enumerate(r.iter_bytes()):
                if kind == "cut" and i >= 1:
                    break
        return f"{kind}:{r.status_code}"
    elif kind == "upload":
        r = http.post("/v1/tts", data={"text": text(rng), "prompt_text": "a voice for the soak test", "format": fmt},
                      files={"prompt_audio": ("p.wav", prompt_wav(rng), "audio/wav")})
    elif kind == "library":
        r = http.post("/v1/tts", json={"text": text(rng), "voice": "soak", "format": fmt})
    elif kind == "openai":
        r = http.post("/v1/audio/speech", json={"model": "tts-1", "input": text(rng), "voice": "alloy",
                                                "response_format": fmt})
    else:
        with connect(ws_url, max_size=None, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "session.config", "response_format": "pcm"}))
            for _ in range(2):
                ws.send(json.dumps({"type": "input.text", "text": text(rng)}))
                ws.send(json.dumps({"type": "input.done"}))
                while True:
                    m = ws.recv(timeout=120)
                    if isinstance(m, str) and (event := json.loads(m)["type"]) in ("audio.done", "error"):
                        break
            ws.send(json.dumps({"type": "session.close"}))
        return f"ws:{'ok' if event == 'audio.done' else 'error'}"
    return f"{kind}:{r.status_code}"


class Pause:
    """Lets the main loop stop the clients between requests: ``rest()`` returns once none is in a request."""

    def __init__(self) -> None:
        self.cond, self.running, self.busy = threading.Condition(), True, 0

    def enter(self, stop: threading.Event) -> bool:
        with self.cond:
            while not self.running and not stop.is_set():
                self.cond.wait(1.0)
            self.busy += 1
            return not stop.is_set()

    def leave(self) -> None:
        with self.cond:
            self.busy -= 1
            self.cond.notify_all()

    def rest(self, timeout: float = 300.0) -> None:
        with self.cond:
            self.running = False
            self.cond.wait_for(lambda: self.busy == 0, timeout)

    def resume(self) -> None:
        with self.cond:
            self.running = True
            self.cond.notify_all()


def client(base: str, ws_url: str, seed: int, stop: threading.Event, counts: dict, lock: threading.Lock,
           pause: Pause) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=base, timeout=300) as http:
        while pause.enter(stop):
            try:
                outcome = one_request(http, ws_url, rng)
            except Exception as exc:
                outcome = f"exception:{type(exc).__name__}"
            finally:
                pause.leave()
            with lock:
                counts[outcome] = counts.get(outcome, 0) + 1
            if not outcome.endswith(("200", "ok")):
                time.sleep(rng.uniform(0.2, 1.0))  # refused (503) or failed: back off as a client would
        pause.leave()


def memory_metrics(base: str) -> tuple[dict[str, float], dict[str, float]]:
    """The memory metrics, and the admission gauges (limit, lanes, load) that say how the gate settled."""
    samples = scrape(base, labels=True)
    gate = {k: next((v for name, v in samples.items() if name.split("{")[0] == f"tts_admission_{k}"), float("nan"))
            for k in ("limit", "lanes", "load")}
    return {name: value for name, value in samples.items() if name.startswith(METRICS)}, gate


class Rest(NamedTuple):
    """One reading at rest: seconds since the start, RSS, glibc's in-use and free bytes, and the RSS split into
    anonymous and file-backed pages (a jump glibc does not count shows in one of them)."""

    t: float
    rss: float
    in_use: float
    free: float
    anon: float
    file: float


def rss_parts(proc: psutil.Process) -> tuple[float, float, float]:
    """(RSS, its anonymous part, its file-backed and shared part) of one reading; psutil's ``shared`` is the
    kernel's RssFile + RssShmem (NaN where psutil does not give it)."""
    mem = proc.memory_info()
    shared = float(getattr(mem, "shared", float("nan")))
    return float(mem.rss), mem.rss - shared, shared


def at_rest(pause: Pause, proc: psutil.Process, base: str, rest_s: float, t0: float) -> Rest:
    """A reading once no request is in flight and ``rest_s`` has passed."""
    pause.rest()
    try:
        time.sleep(rest_s)
        (rss, anon, file), (sampled, _) = rss_parts(proc), memory_metrics(base)
    finally:
        pause.resume()
    heap = {state: sampled.get(f'process_heap_bytes{{state="{state}"}}', float("nan")) for state in ("in_use", "free")}
    return Rest(time.monotonic() - t0, rss, heap["in_use"], heap["free"], anon, file)


def growth(samples: list[tuple[float, float]], warmup_s: float) -> tuple[float, float, float]:
    """The slope after the warm-up, and over each half of it (the spread), MB per hour."""
    after = [s for s in samples if s[0] >= warmup_s]
    half = len(after) // 2
    return slope_mb_per_h(after), slope_mb_per_h(after[:half]), slope_mb_per_h(after[half:])


def slope_mb_per_h(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS over time, MB per hour."""
    samples = [s for s in samples if s[1] == s[1]]  # NaN: not read
    if len(samples) < 3:
        return float("nan")
    t = np.array([s for s, _ in samples]) / 3600.0
    rss = np.array([r for _, r in samples]) / 2**20
    return float(np.polyfit(t, rss, 1)[0])


def rest_lines(rests: list[Rest], rested: dict, args: argparse.Namespace) -> list[str]:
    """The readings at rest: with no request in flight, the RSS that stays."""
    rss, in_use, free, anon, file = (rested[k] for k in ("rss", "in_use", "free", "anon", "file"))
    return [
        (f"At rest (every {args.rest_every:g} min the clients pause; read {args.rest_s:g} s after the last request "
        f"ended), growth after the warm-up: RSS **{rss[0]:+.1f} MB/h** (halves {rss[1]:+.1f}, {rss[2]:+.1f}); "
        f"glibc in use {in_use[0]:+.1f} MB/h (halves {in_use[1]:+.1f}, {in_use[2]:+.1f}), free {free[0]:+.1f} MB/h "
        f"(halves {free[1]:+.1f}, {free[2]:+.1f}); RSS anonymous {anon[0]:+.1f} MB/h, file-backed {file[0]:+.1f} MB/h."),
        "",
        *table(["minute", "RSS at rest (MB)", "glibc in use (MB)", "glibc free (MB)", "anonymous (MB)",
                "file-backed (MB)"],
               [[f"{r.t / 60:.1f}", *(f"{v / 2**20:.0f}" for v in r[1:])] for r in rests]),
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    ap = SuiteParser(__doc__, "soak", server=False)
    ap.add_argument("--minutes", type=float, default=70.0)
    ap.add_argument("--warmup", type=float, default=10.0, help="minutes left out of the slope")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--sample-s", type=float, default=30.0)
    ap.add_argument("--rest-every", type=float, default=5.0,
                    help="minutes between rests: the clients pause, RSS is read with no request in flight (0: never)")
    ap.add_argument("--rest-s", type=float, default=15.0, help="seconds of a rest before the reading (trims run every 10)")
    ap.add_argument("--model-dir", help="a model dir (default: the tiny CosyVoice2)")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server's environment")
    args = ap.parse(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = tiny_config(tmp)
        if args.model_dir:
            cfg["engine"] = {"model_dir": args.model_dir}
        srv = ServerProc("soak", cfg, Path(tmp))
        srv.env.update(dict(e.split("=", 1) for e in args.env))
        with srv:
            base = srv.base_url
            ws_url = f"ws://127.0.0.1:{srv.port}/v1/audio/speech/stream"
            proc = psutil.Process(srv.proc.pid)
            r = httpx.post(base + "/v1/voices", data={"name": "soak", "transcript": "a voice for the soak test"},
                           files={"audio": ("v.wav", prompt_wav(random.Random(0)), "audio/wav")}, timeout=120)
            r.raise_for_status()
            ready_rss = proc.memory_info().rss
            stop, lock, counts, pause = threading.Event(), threading.Lock(), {}, Pause()
            threads = [threading.Thread(target=client, args=(base, ws_url, i, stop, counts, lock, pause), daemon=True)
                       for i in range(args.clients)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            samples, mem, limits, rests = [], [], [], []  # (seconds, RSS); memory metrics; admission limits; rests
            next_rest = args.rest_every * 60 if args.rest_every > 0 else float("inf")
            while (elapsed := time.monotonic() - t0) < args.minutes * 60:
                time.sleep(min(args.sample_s, args.minutes * 60 - elapsed))
                samples.append((time.monotonic() - t0, proc.memory_info().rss))
                sampled, gate = memory_metrics(base)
                mem.append(sampled)
                limits.append(gate["limit"])
                print(f"{samples[-1][0] / 60:6.1f} min  RSS {samples[-1][1] / 2**20:8.1f} MB  {sum(counts.values())} "
                      f"requests  limit {gate['limit']:g} lanes {gate['lanes']:g} load {gate['load']:.2f}", flush=True)
                if samples[-1][0] >= next_rest:
                    rests.append(at_rest(pause, proc, base, args.rest_s, t0))
                    next_rest += args.rest_every * 60
                    r = rests[-1]
                    print(f"{r.t / 60:6.1f} min  at rest: RSS {r.rss / 2**20:.1f} MB (anonymous {r.anon / 2**20:.1f}, "
                          f"file {r.file / 2**20:.1f}), glibc in use {r.in_use / 2**20:.1f} MB, free "
                          f"{r.free / 2**20:.1f} MB", flush=True)
            stop.set()
            for t in threads:
                t.join(300)
            live = httpx.get(base + "/health/live", timeout=10).status_code
    slope, first, second = growth(samples, args.warmup * 60)
    rested = {k: growth([(r.t, getattr(r, k)) for r in rests], args.warmup * 60) for k in Rest._fields[1:]}
    by_minute = {int(s // 60): r for s, r in samples}
    minutes = sorted(by_minute)
    shown = minutes[::max(1, len(minutes) // 12)]
    if minutes and shown[-1] != minutes[-1]:
        shown.append(minutes[-1])  # and the last minute
    lines = [
        f"# Memory soak: {args.minutes:g} min of mixed traffic, {args.clients} clients",
        "",
        f"Command: `{COMMAND} --minutes {args.minutes:g} --warmup {args.warmup:g} --clients {args.clients}"
        + (f" --model-dir {args.model_dir}" if args.model_dir else "") + "".join(f" --env {e}" for e in args.env)
        + "` (defaults; tiny random-weight CosyVoice2 unless a model dir is given)",
        machine(),
        "",
        f"Requests: {sum(counts.values())} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}); "
        f"/health/live at the end: {live}. RSS when ready: {ready_rss / 2**20:.0f} MB. "
        + (f"Admission limit over the samples: mean {np.nanmean(limits):.2f}, min {np.nanmin(limits):g}, "
           f"max {np.nanmax(limits):g}." if limits else ""),
        "",
        *table(["minute", *map(str, shown)], [["RSS (MB)", *(f"{by_minute[m] / 2**20:.0f}" for m in shown)]]),
        "",
        f"Growth after the {args.warmup:g}-minute warm-up: **{slope:+.1f} MB/h** (first half {first:+.1f}, second "
        f"half {second:+.1f}).",
        "",
        *(rest_lines(rests, rested, args) if rests else []),
        "Memory metrics at the end: " + ", ".join(f"`{k}` {v / 2**20:.1f} MB" for k, v in sorted(mem[-1].items()))
        if mem else "",
    ]
    print("\n".join(lines))
    save(args.out, "soak", None, "\n".join(lines) + "\n")
