"""The ws scenario's clients (``CLIENTS``): each ``leg(target, pieces, rate, seed) -> Session`` feeds the LLM's
tokens at ``rate`` tokens/s if the client streams text in, else sends the whole text once the last would be written;
the clock starts at the first token (bench/README.md)."""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

PCM_BYTES_PER_S = 24000 * 2  # the tiny CosyVoice2's s16le mono at 24 kHz
GIVE_UP_S = 120.0


@dataclass
class Target:
    base: str  # http://127.0.0.1:PORT
    wyoming_port: int | None = None

    @property
    def ws(self) -> str:
        return self.base.replace("http", "ws", 1) + "/v1/audio/speech/stream"


@dataclass
class Session:
    """One session's clock (perf_counter seconds): first token, first and last audio; audio seconds."""

    t0: float
    first: float | None = None
    end: float | None = None
    audio_s: float = 0.0
    early: bool | None = None  # wyoming-stream: first audio before synthesize-stop was sent

    def audio(self, seconds: float) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.end, self.audio_s = now, self.audio_s + seconds

    @property
    def ttfa(self) -> float:
        if self.first is None:
            raise RuntimeError("no audio")
        return self.first - self.t0

    @property
    def total(self) -> float:
        return self.end - self.t0


async def paced(send, pieces: list[str], rate: float) -> None:
    """``send`` (a function or a coroutine function) each piece, 1/``rate`` s apart."""
    for i, piece in enumerate(pieces):
        if i:
            await asyncio.sleep(1.0 / rate)
        sent = send(piece)
        if inspect.isawaitable(sent):
            await sent


async def fed(feed, receive) -> Session:
    """A session whose clock starts now: ``feed()`` (the text, paced) beside ``receive(session)`` (the audio)."""
    s = Session(time.perf_counter())
    feeder = asyncio.create_task(feed())
    try:
        await receive(s)
        await feeder
    finally:
        feeder.cancel()
    return s


async def pcm(s: Session, chunks) -> None:
    async for chunk in chunks:
        if chunk:
            s.audio(len(chunk) / PCM_BYTES_PER_S)


async def after_text(pieces: list[str], rate: float) -> Session:
    """The whole-text clients' wait for the LLM's last token; the session's clock starts at its first."""
    s = Session(time.perf_counter())
    await asyncio.sleep((len(pieces) - 1) / rate)
    return s


async def ws(t: Target, pieces: list[str], rate: float, seed: int) -> Session:
    from websockets.asyncio.client import connect

    async with connect(t.ws, max_size=None) as sock:
        await sock.send(json.dumps({"type": "session.config", "response_format": "pcm", "seed": seed}))

        async def feed() -> None:
            await paced(lambda p: sock.send(json.dumps({"type": "input.text", "text": p})), pieces, rate)
            await sock.send(json.dumps({"type": "input.done"}))

        async def receive(s: Session) -> None:
            async for m in sock:
                if isinstance(m, bytes):
                    s.audio(len(m) / PCM_BYTES_PER_S)
                elif (event := json.loads(m))["type"] == "error":
                    raise RuntimeError(event)
                elif event["type"] == "audio.done":
                    return

        return await fed(feed, receive)


async def post(t: Target, pieces: list[str], rate: float, seed: int) -> Session:
    s = await after_text(pieces, rate)
    body = {"text": "".join(pieces), "format": "pcm", "stream": True, "seed": seed}
    async with httpx.AsyncClient(timeout=GIVE_UP_S) as c, c.stream("POST", t.base + "/v1/tts", json=body) as r:
        r.raise_for_status()
        await pcm(s, r.aiter_bytes())
    return s


async def openai_sdk(t: Target, pieces: list[str], rate: float, seed: int) -> Session:
    from openai import AsyncOpenAI

    s = await after_text(pieces, rate)
    client = AsyncOpenAI(base_url=t.base + "/v1", api_key="x", timeout=GIVE_UP_S)
    async with client, client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input="".join(pieces), response_format="pcm",
            extra_body={"seed": seed}) as r:
        await pcm(s, r.iter_bytes())
    return s


async def _pipecat(tts: Any, pieces: list[str], rate: float) -> Session:
    """A turn of LLM tokens through a Pipecat TTS service, until its TTSStoppedFrame or error (or 3 s without audio)."""
    from loguru import logger
    from pipecat.frames.frames import (
        ErrorFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSStoppedFrame,
    )
    from pipecat.observers.base_observer import BaseObserver
    from pipecat.tests.utils import SleepFrame, run_test

    logger.remove()  # Pipecat logs every frame at DEBUG
    logger.add(sys.stderr, level="WARNING")
    s, stopped = Session(0.0), []

    class Seen(BaseObserver):
        async def on_push_frame(self, data) -> None:
            f = data.frame
            if data.destination is tts and isinstance(f, LLMTextFrame) and not s.t0:
                s.t0 = time.perf_counter()
            elif data.source is tts and isinstance(f, TTSAudioRawFrame):
                s.audio(len(f.audio) / 2 / f.sample_rate / f.num_channels)
            elif data.source is tts and (isinstance(f, ErrorFrame) or isinstance(f, TTSStoppedFrame) and s.first):
                stopped.append(f)  # the turn is over (an error: refused, as when the server is overloaded)

    def frames():  # run_test iterates it lazily: the turn at the LLM's pace, then wait for the audio
        yield LLMFullResponseStartFrame()
        for i, piece in enumerate(pieces):
            if i:
                yield SleepFrame(sleep=1.0 / rate)
            yield LLMTextFrame(piece)
        yield LLMFullResponseEndFrame()
        give_up = time.perf_counter() + GIVE_UP_S
        while not stopped and time.perf_counter() < give_up and (
                s.end is None or time.perf_counter() - s.end < 3.0):
            yield SleepFrame(sleep=0.02)

    _, up = await run_test(tts, frames_to_send=frames(), observers=[Seen()], start_timeout=30.0)
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    if errors:
        raise RuntimeError(errors[0])
    return s


async def pipecat(t: Target, pieces: list[str], rate: float, seed: int) -> Session:
    from cosyserve_plugins.pipecat import CosyserveTTSService

    return await _pipecat(CosyserveTTSService(base_url=t.base, seed=seed), pieces, rate)


async def pipecat_openai(t: Target, pieces: list[str], rate: float, seed: int) -> Session:
    from openai import DefaultAsyncHttpxClient
    from pipecat.services.openai.tts import OpenAITTSService

    async with DefaultAsyncHttpxClient() as http:  # the service never closes its own
        tts = OpenAITTSService(api_key="x", base_url=t.base + "/v1", sample_rate=24000, http_client=http)
        return await _pipecat(tts, pieces, rate)


async def _wyoming_audio(client: Any, s: Session, last: str) -> None:
    """Events until ``last`` (audio-stop or synthesize-stopped), audio counted; an error event raises."""
    from wyoming.audio import AudioChunk
    from wyoming.error import Error

    while True:
        event = await asyncio.wait_for(client.read_event(), GIVE_UP_S)
        if event is None:
            raise RuntimeError("the server closed the connection")
        if AudioChunk.is_type(event.type):
            c = AudioChunk.from_event(event)
            s.audio(len(c.audio) / (c.rate * c.width * c.channels))
        elif Error.is_type(event.type):
            raise RuntimeError(Error.from_event(event).text)
        elif event.type == last:
            return


async def wyoming_stream(t: Target, pieces: list[str], rate: float, seed: int) -> Session:
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop

    async with AsyncTcpClient("127.0.0.1", t.wyoming_port) as client:
        await client.write_event(SynthesizeStart().event())
        stop_sent: list[float] = []

        async def feed() -> None:
            await paced(lambda p: client.write_event(SynthesizeChunk(text=p).event()), pieces, rate)
            stop_sent.append(time.perf_counter())
            await client.write_event(SynthesizeStop().event())

        s = await fed(feed, lambda s: _wyoming_audio(client, s, "synthesize-stopped"))
    s.early = s.first is not None and s.first < stop_sent[0]
    return s


async def wyoming(t: Target, pieces: list[str], rate: float, seed: int) -> Session:
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    s = await after_text(pieces, rate)
    async with AsyncTcpClient("127.0.0.1", t.wyoming_port) as client:
        await client.write_event(Synthesize(text="".join(pieces)).event())
        await _wyoming_audio(client, s, "audio-stop")
    return s


async def _livekit(tts: Any, pieces: list[str], rate: float) -> Session:
    """A LiveKit TTS fed through ``stream()``, to its last audio frame (its emitter's 200 ms frames)."""
    stream = tts.stream()

    async def feed() -> None:
        await paced(stream.push_text, pieces, rate)
        stream.end_input()

    async def receive(s: Session) -> None:
        async for ev in stream:
            s.audio(ev.frame.duration)

    try:
        s = await fed(feed, receive)
    finally:
        await stream.aclose()
    if s.first is None:
        raise RuntimeError("no audio")
    return s


async def livekit_plugin(t: Target, pieces: list[str], rate: float, seed: int) -> Session:
    from cosyserve_plugins.livekit import TTS

    async with TTS(base_url=t.base, seed=seed) as tts:
        return await _livekit(tts, pieces, rate)


async def livekit_openai(t: Target, pieces: list[str], rate: float, seed: int) -> Session:
    """LiveKit's ``openai.TTS`` as an agent wraps it: ``StreamAdapter`` POSTs each sentence once complete."""
    from livekit.agents.tts import StreamAdapter
    from livekit.plugins import openai

    inner = openai.TTS(base_url=f"{t.base}/v1", api_key="x", model="tts-1", response_format="pcm")
    tts = StreamAdapter(tts=inner)
    try:
        return await _livekit(tts, pieces, rate)
    finally:
        await tts.aclose()
        await inner.aclose()


# name: (the leg, the modules it needs: a client without them is skipped)
CLIENTS = {
    "ws": (ws, ("websockets",)), "post": (post, ()), "openai-sdk": (openai_sdk, ("openai",)),
    "livekit-plugin": (livekit_plugin, ("cosyserve_plugins.livekit",)),
    "livekit-openai": (livekit_openai, ("livekit.agents", "livekit.plugins.openai")),
    "pipecat": (pipecat, ("cosyserve_plugins.pipecat", "pipecat.tests.utils")),
    "pipecat-openai": (pipecat_openai, ("pipecat.services.openai.tts", "pipecat.tests.utils")),
    "wyoming-stream": (wyoming_stream, ("wyoming.client",)), "wyoming": (wyoming, ("wyoming.client",)),
}
# each plugin and the OpenAI path its framework falls back to (the goal: the plugin's p50 is lower)
PLUGIN_VS_OPENAI = {"livekit-plugin": "livekit-openai", "pipecat": "pipecat-openai"}


def missing(name: str) -> str | None:
    """Why a client cannot run here (a module it needs does not import), or None."""
    import importlib

    for module in CLIENTS[name][1]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"{module}: {exc}"
    return None


async def batch(name: str, t: Target, pieces: list[str], rate: float, n: int, seed: int) -> list:
    """``n`` sessions of one client at once (each its own seed)."""
    leg = CLIENTS[name][0]
    return await asyncio.gather(*(leg(t, pieces, rate, seed + i) for i in range(n)), return_exceptions=True)
