"""Time to first audio for text that arrives at an LLM's pace: WebSocket vs POST (each text's tokens at ``--rate``,
the POST when the LLM would have finished). bench/README.md describes it (``--livekit`` left the tree after 776f578,
``--clients``, the agent frameworks' clients side by side, after b664af8)."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.lib.procs import ServerProc, SuiteParser, machine, tiny_config
from bench.report import save, table

COMMAND = ".venv/bin/python -m bench serve --scenario ws"
PCM_BYTES_PER_S = 24000 * 2  # the tiny CosyVoice2's s16le mono at 24 kHz
TEXTS = {
    "20 words": "The quick brown fox jumps over the lazy dog while a small grey cat watches from the warm window.",
    "40 words": ("Voice agents stream the words of a language model into speech while the model is still writing "
                 "them, so the listener hears the start of the answer long before its last word has been generated, "
                 "and the conversation feels like talking to a person."),
}


def tokens(text: str) -> list[str]:
    """LLM-sized pieces: each word with its leading space, punctuation on its own."""
    return re.findall(r"\s*\w+|\s*[^\w\s]", text)


class Clock:
    """One session's clock (perf_counter seconds) from the first token the LLM wrote: first and last audio."""

    def __init__(self) -> None:
        self.t0, self.first, self.end = time.perf_counter(), None, None

    def audio(self) -> None:
        self.end = time.perf_counter()
        self.first = self.first or self.end

    def times(self) -> tuple[float, float]:
        if self.first is None:
            raise RuntimeError("no audio")
        return self.first - self.t0, self.end - self.t0


async def ws(base: str, pieces: list[str], rate: float, seed: int) -> tuple[float, float]:
    """The WebSocket session: each token as it is written, then ``input.done``."""
    from websockets.asyncio.client import connect

    async with connect(base.replace("http", "ws", 1) + "/v1/audio/speech/stream", max_size=None) as sock:
        await sock.send(json.dumps({"type": "session.config", "response_format": "pcm", "seed": seed}))
        clock = Clock()

        async def feed() -> None:
            for i, piece in enumerate(pieces):
                await asyncio.sleep(1.0 / rate if i else 0)
                await sock.send(json.dumps({"type": "input.text", "text": piece}))
            await sock.send(json.dumps({"type": "input.done"}))

        feeder = asyncio.create_task(feed())
        try:
            async for m in sock:
                if isinstance(m, bytes):
                    clock.audio()
                elif (event := json.loads(m))["type"] == "error":
                    raise RuntimeError(event)
                elif event["type"] == "audio.done":
                    break
            await feeder
        finally:
            feeder.cancel()
    return clock.times()


async def post(base: str, pieces: list[str], rate: float, seed: int) -> tuple[float, float]:
    """A streamed POST of the whole text, sent when the LLM would have written its last token."""
    clock = Clock()
    await asyncio.sleep((len(pieces) - 1) / rate)
    body = {"text": "".join(pieces), "format": "pcm", "stream": True, "seed": seed}
    async with httpx.AsyncClient(timeout=120) as c, c.stream("POST", base + "/v1/tts", json=body) as r:
        r.raise_for_status()
        async for chunk in r.aiter_bytes():
            if chunk:
                clock.audio()
    return clock.times()


def one(leg, base: str, text: str, rate: float, seed: int) -> tuple[float, float]:
    """(TTFA, total) seconds of one session of ``leg`` (ws or post) for ``text`` at ``rate``."""
    return asyncio.run(leg(base, tokens(text), rate, seed))


def main(argv: list[str] | None = None) -> None:
    ap = SuiteParser(__doc__, "ws_ttfa", server=False)
    ap.add_argument("--rate", type=float, default=20.0, help="tokens per second the 'LLM' writes")
    ap.add_argument("--reps", type=int, default=5, help="runs per point")
    args = ap.parse(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = tiny_config(tmp, engine={"torch_threads": 1}, pool={"workers": 2})
        with ServerProc("ws-ttfa", cfg, Path(tmp)) as srv:
            base = srv.base_url
            for label, text in TEXTS.items():
                one(ws, base, text, args.rate, 0)  # warm-up
                one(post, base, text, 1e6, 0)
                runs = [(one(ws, base, text, args.rate, rep), one(post, base, text, args.rate, rep))
                        for rep in range(args.reps)]  # per run: (ws, post), each (TTFA, done)
                n = len(tokens(text))
                med = [statistics.median(r[leg][i] for r in runs) for i in (0, 1) for leg in (0, 1)]
                rows.append((label, n, (n - 1) / args.rate, *med))
                print(rows[-1], flush=True)
    lines = [
        f"# Time to first audio: text streamed at {args.rate:g} tokens/s over the WebSocket vs. POST after the text",
        "",
        (f"Command: `{COMMAND} --rate {args.rate:g} --reps {args.reps}` (tiny random-weight CosyVoice2, default "
         "config: batched LLM, bistream; 2 workers, 1 torch thread)"),
        f"{machine()} Medians of {args.reps} runs.",
        "",
        *table(["text", "tokens", "text written in (s)", "TTFA WebSocket (s)", "TTFA POST after text (s)",
                "done WebSocket (s)", "done POST (s)"],
               [[label, n, f"{written:.2f}", *(f"{t:.3f}" for t in times)] for label, n, written, *times in rows]),
        "", "All times from the first token the LLM wrote. 'done': the last audio byte.",
    ]
    print("\n".join(lines))
    save(args.out, "ws-ttfa", None, "\n".join(lines) + "\n")
