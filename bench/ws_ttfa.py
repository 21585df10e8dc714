"""Benchmark: time to first audio for text that arrives at an LLM's pace, WebSocket vs. POST.

    .venv/bin/python -m bench serve --scenario ws   # prints a Markdown table, writes .cache/bench/ws_ttfa/ws-ttfa.md

A real ``cosyserve serve`` on the tiny CosyVoice2 (the default config: batched LLM,
so streamed text goes into bistream sequences). For each text, ``--reps`` times:

  (a) WebSocket: ``input.text`` one token (a word or a punctuation mark) every
      1/``--rate`` seconds, then ``input.done``; TTFA = first binary frame - first
      ``input.text`` sent;
  (b) POST after the full text: the client waits until the LLM would have written the
      last token ((tokens - 1) / rate seconds after the first), then POSTs the whole
      text to ``/v1/tts`` (streamed pcm); TTFA = that wait + the POST's first byte.

Both ask for the same seed. The tiny model's audio is noise: only the timing counts.

``--livekit`` adds the same tokens at the same pace through LiveKit Agents (bench/lib/livekit_ttfa.py):
our plugin on the WebSocket vs. LiveKit's OpenAI TTS a sentence at a time (needs the dev extra).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
from websockets.sync.client import connect

from bench.lib.procs import ROOT, cosyserve
from bench.report import save, table

COMMAND = ".venv/bin/python -m bench serve --scenario ws"
TEXTS = {
    "20 words": "The quick brown fox jumps over the lazy dog while a small grey cat watches from the warm window.",
    "40 words": ("Voice agents stream the words of a language model into speech while the model is still writing "
                 "them, so the listener hears the start of the answer long before its last word has been generated, "
                 "and the conversation feels like talking to a person."),
}


def tokens(text: str) -> list[str]:
    """LLM-sized pieces: each word with its leading space, punctuation on its own."""
    return re.findall(r"\s*\w+|\s*[^\w\s]", text)


def ws_run(url: str, text: str, rate: float, seed: int) -> tuple[float, float]:
    """(TTFA, total) seconds for one utterance fed at ``rate`` tokens/s."""
    pieces = tokens(text)
    t0: list[float] = []
    with connect(url, max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "seed": seed}))

        def feed() -> None:
            for i, p in enumerate(pieces):
                if i:
                    time.sleep(1.0 / rate)
                ws.send(json.dumps({"type": "input.text", "text": p}))
                if not t0:
                    t0.append(time.perf_counter())
            ws.send(json.dumps({"type": "input.done"}))

        feeder = threading.Thread(target=feed)
        feeder.start()
        first = None
        while True:
            m = ws.recv(timeout=120)
            if isinstance(m, bytes):
                first = first or time.perf_counter()
                continue
            event = json.loads(m)
            if event["type"] == "error":
                raise RuntimeError(event)
            if event["type"] == "audio.done":
                done = time.perf_counter()
                break
        feeder.join()
    return first - t0[0], done - t0[0]


def post_run(base: str, text: str, rate: float, seed: int) -> tuple[float, float]:
    """(TTFA, total) counting the wait for the whole text at ``rate`` tokens/s."""
    wait = (len(tokens(text)) - 1) / rate
    time.sleep(wait)  # the client waits for the LLM, as it would
    t0 = time.perf_counter()
    first = None
    with httpx.stream("POST", base + "/v1/tts", json={"text": text, "format": "pcm", "stream": True, "seed": seed},
                      timeout=120) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            if chunk and first is None:
                first = time.perf_counter()
    done = time.perf_counter()
    return wait + first - t0, wait + done - t0


def livekit_medians(base: str, text: str, rate: float, reps: int) -> list[float]:
    """Median TTFA through LiveKit: our plugin (WebSocket), then its OpenAI TTS a sentence at a time."""
    from bench.lib.livekit_ttfa import openai_run, plugin_run

    pieces = tokens(text)
    plugin_run(base, pieces, rate, 0)  # warm-up
    openai_run(base, pieces, rate, 0)
    plugin = [plugin_run(base, pieces, rate, rep)[0] for rep in range(reps)]
    oai = [openai_run(base, pieces, rate, rep)[0] for rep in range(reps)]
    return [statistics.median(plugin), statistics.median(oai)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=20.0, help="tokens per second the 'LLM' writes")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--livekit", action="store_true", help="also time LiveKit: our plugin vs. its OpenAI TTS")
    ap.add_argument("--out", default=str(ROOT / ".cache" / "bench" / "ws_ttfa"), help="output dir (writes ws-ttfa.md)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"engine": {"torch_threads": 1}, "pool": {"workers": 2}, "server": {"access_log": False},
               "dev": {"tiny_version": 2, "tiny_cache_dir": str(ROOT / ".cache" / "models")},
               "voices": {"dir": str(Path(tmp) / "voices")}}
        with cosyserve("ws-ttfa", cfg, Path(tmp)) as srv:
            base, url = srv.base_url, f"ws://127.0.0.1:{srv.port}/v1/audio/speech/stream"
            rows = []
            for label, text in TEXTS.items():
                ws_run(url, text, args.rate, 0)  # warm-up
                post_run(base, text, 1e6, 0)
                ws, post = [], []
                for rep in range(args.reps):
                    ws.append(ws_run(url, text, args.rate, rep))
                    post.append(post_run(base, text, args.rate, rep))
                n = len(tokens(text))
                med = [statistics.median(x) for x in ([a for a, _ in ws], [a for a, _ in post],
                                                      [b for _, b in ws], [b for _, b in post])]
                if args.livekit:
                    med += livekit_medians(base, text, args.rate, args.reps)
                rows.append((label, n, (n - 1) / args.rate, *med))
                print(rows[-1], flush=True)
    lines = [
        f"# Time to first audio: text streamed at {args.rate:g} tokens/s over the WebSocket vs. POST after the text",
        "",
        (f"Command: `{COMMAND} --rate {args.rate:g} --reps {args.reps}{' --livekit' * args.livekit}` (tiny random-weight CosyVoice2, default "
         "config: batched LLM, bistream; 2 workers, 1 torch thread)"),
        (f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
         f"Medians of {args.reps} runs."),
        "",
        *table(["text", "tokens", "text written in (s)", "TTFA WebSocket (s)", "TTFA POST after text (s)",
                "done WebSocket (s)", "done POST (s)",
                *(["TTFA LiveKit plugin (s)", "TTFA LiveKit openai.TTS (s)"] if args.livekit else [])],
               [[label, n, f"{written:.2f}", *(f"{t:.3f}" for t in times)] for label, n, written, *times in rows]),
        "", "All times from the first token the LLM wrote. 'done': the last audio byte.",
    ]
    print("\n".join(lines))
    save(Path(args.out), "ws-ttfa", None, "\n".join(lines) + "\n")
