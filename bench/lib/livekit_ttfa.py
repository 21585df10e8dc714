"""First audio through LiveKit Agents for text that arrives token by token (``bench serve --scenario ws --livekit``).

Both legs run what a LiveKit agent runs, fed the same tokens at the same pace through ``stream()``:

* ``plugin_run``: our plugin (``cosyserve_plugins.livekit``), each token an ``input.text`` on the
  WebSocket the moment it is pushed;
* ``openai_run``: LiveKit's ``openai.TTS`` on ``/v1/audio/speech`` (pcm), wrapped as an agent wraps a
  TTS that cannot stream text in: ``StreamAdapter`` cuts the tokens into sentences and POSTs each one
  once it is complete.

Times count from the first token pushed to the first and to the last audio frame LiveKit hands the
agent (its emitter's 200 ms frames, the same on both legs).
"""

from __future__ import annotations

import asyncio
import time


async def _first_audio(tts, pieces: list[str], rate: float) -> tuple[float, float]:
    stream = tts.stream()
    started: list[float] = []

    async def feed() -> None:
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(1.0 / rate)
            stream.push_text(piece)
            if not started:
                started.append(time.perf_counter())
        stream.end_input()

    feeder = asyncio.create_task(feed())
    first = None
    try:
        async for _ in stream:
            first = first or time.perf_counter()
        done = time.perf_counter()
        await feeder
    finally:
        feeder.cancel()
        await stream.aclose()
    if first is None:
        raise RuntimeError("no audio")
    return first - started[0], done - started[0]


def plugin_run(base: str, pieces: list[str], rate: float, seed: int) -> tuple[float, float]:
    """(TTFA, total) seconds through our LiveKit plugin on the WebSocket route."""
    from cosyserve_plugins.livekit import TTS

    async def main() -> tuple[float, float]:
        async with TTS(base_url=base, seed=seed) as tts:
            return await _first_audio(tts, pieces, rate)

    return asyncio.run(main())


def openai_run(base: str, pieces: list[str], rate: float, seed: int) -> tuple[float, float]:
    """(TTFA, total) seconds through LiveKit's OpenAI TTS, a sentence at a time (no seed on that route's client)."""
    from livekit.agents.tts import StreamAdapter
    from livekit.plugins import openai

    async def main() -> tuple[float, float]:
        inner = openai.TTS(base_url=f"{base}/v1", api_key="x", model="tts-1", response_format="pcm")
        tts = StreamAdapter(tts=inner)
        try:
            return await _first_audio(tts, pieces, rate)
        finally:
            await tts.aclose()
            await inner.aclose()

    return asyncio.run(main())
