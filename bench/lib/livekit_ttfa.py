"""First audio through LiveKit Agents for text that arrives token by token (``bench serve --scenario ws --livekit``).

Both legs run what a LiveKit agent runs, fed the same tokens at the same pace through ``stream()``:

* ``plugin_run``: our plugin (``cosyserve_plugins.livekit``), each token an ``input.text`` on the
  WebSocket the moment it is pushed;
* ``openai_run``: LiveKit's ``openai.TTS`` on ``/v1/audio/speech`` (pcm), wrapped as an agent wraps a
  TTS that cannot stream text in: ``StreamAdapter`` cuts the tokens into sentences and POSTs each one
  once it is complete.

Times count from the first token pushed to the first and to the last audio frame LiveKit hands the
agent (its emitter's 200 ms frames, the same on both legs). ``plugin_leg``/``openai_leg`` are the
coroutines the ``--clients`` table runs (bench/lib/clients_ttfa.py), several at once.
"""

from __future__ import annotations

import asyncio
import time

from bench.lib.clients_ttfa import Session, paced


async def _first_audio(tts, pieces: list[str], rate: float) -> Session:
    stream = tts.stream()

    async def feed() -> None:
        await paced(stream.push_text, pieces, rate)
        stream.end_input()

    s = Session(time.perf_counter())
    feeder = asyncio.create_task(feed())
    try:
        async for ev in stream:
            s.audio(ev.frame.duration)
        await feeder
    finally:
        feeder.cancel()
        await stream.aclose()
    if s.first is None:
        raise RuntimeError("no audio")
    return s


async def plugin_leg(base: str, pieces: list[str], rate: float, seed: int) -> Session:
    """One session through our LiveKit plugin on the WebSocket route."""
    from cosyserve_plugins.livekit import TTS

    async with TTS(base_url=base, seed=seed) as tts:
        return await _first_audio(tts, pieces, rate)


async def openai_leg(base: str, pieces: list[str], rate: float, seed: int) -> Session:
    """One session through LiveKit's OpenAI TTS, a sentence at a time (no seed on that route's client)."""
    from livekit.agents.tts import StreamAdapter
    from livekit.plugins import openai

    inner = openai.TTS(base_url=f"{base}/v1", api_key="x", model="tts-1", response_format="pcm")
    tts = StreamAdapter(tts=inner)
    try:
        return await _first_audio(tts, pieces, rate)
    finally:
        await tts.aclose()
        await inner.aclose()


def plugin_run(base: str, pieces: list[str], rate: float, seed: int) -> tuple[float, float]:
    """(TTFA, total) seconds through our LiveKit plugin."""
    s = asyncio.run(plugin_leg(base, pieces, rate, seed))
    return s.ttfa, s.total


def openai_run(base: str, pieces: list[str], rate: float, seed: int) -> tuple[float, float]:
    """(TTFA, total) seconds through LiveKit's OpenAI TTS."""
    s = asyncio.run(openai_leg(base, pieces, rate, seed))
    return s.ttfa, s.total
