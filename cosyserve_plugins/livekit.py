"""A LiveKit Agents TTS on cosyserve's ``WS /v1/audio/speech/stream``: text in as the LLM writes it.

``TTS(base_url="http://HOST:8000", voice=...)`` streams (``capabilities.streaming``): an agent's
``SynthesizeStream`` sends each ``push_text`` as an ``input.text`` at once, and each ``flush()``
ends the utterance with ``input.done``; audio frames reach the agent as the server writes them.
One socket per concurrent stream, kept in a pool between streams (a session stays open across
utterances), so a turn after the first skips the handshake.

Barge-in: LiveKit interrupts speech by closing the stream. A stream closed while its utterance is
being spoken sends ``input.cancel``; the socket goes back to the pool once the server acknowledges
with ``audio.cancelled`` (after which no frame of that utterance can arrive), and is dropped if the
acknowledgement does not come. Errors become LiveKit's: a server ``error`` event an
``APIStatusError`` (503 and the like retryable), a failed connection ``APIConnectionError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import aiohttp
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    tts,
    utils,
)

from cosyserve_plugins import protocol

SAMPLE_RATE = 24000  # CosyVoice2/3's own rate; the server resamples to any other asked for
CANCEL_ACK_S = 5.0  # the server acknowledges input.cancel within about 3 s, whatever its engine does
REUSE_S = 20.0  # reuse a pooled socket at most this long after its last use (server idle timeout: 30 s)
_CLOSED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)


@dataclass
class _Options:
    voice: str | None
    model: str | None
    speed: float
    instructions: str | None
    seed: int | None


class TTS(tts.TTS):
    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000",
        voice: str | None = None,
        model: str | None = None,
        speed: float = 1.0,
        instructions: str | None = None,
        seed: int | None = None,
        sample_rate: int = SAMPLE_RATE,
        api_key: str | None = None,
        http_session: aiohttp.ClientSession | None = None,
    ) -> None:
        """``voice``: a library voice, preset or OpenAI name (None: the server's first preset).
        ``sample_rate``: the frames' rate, 8000-48000, resampled by the server."""
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True), sample_rate=sample_rate, num_channels=1)
        self._opts = _Options(voice=voice, model=model, speed=speed, instructions=instructions, seed=seed)
        self._url = protocol.stream_url(base_url)
        self._api_key = api_key
        self._session = http_session
        self._owns_session = http_session is None
        self._pool = utils.ConnectionPool[aiohttp.ClientWebSocketResponse](
            connect_cb=self._connect, close_cb=self._close_socket, max_session_duration=REUSE_S,
            mark_refreshed_on_get=True)
        self._settling: set[asyncio.Task[None]] = set()

    @property
    def model(self) -> str:
        return self._opts.model or "cosyvoice"

    @property
    def provider(self) -> str:
        return "cosyserve"

    def update_options(self, *, voice: str | None = None, speed: float | None = None,
                       instructions: str | None = None) -> None:
        """Applies to the next stream: sockets configured the old way are not reused."""
        self._opts = replace(self._opts, voice=voice or self._opts.voice, speed=speed or self._opts.speed,
                             instructions=instructions if instructions is not None else self._opts.instructions)
        self._pool.invalidate()

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
                   ) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    def prewarm(self) -> None:
        self._pool.prewarm()

    async def aclose(self) -> None:
        if self._settling:
            await asyncio.wait(self._settling)
        await self._pool.aclose()
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    # -- sockets -----------------------------------------------------------------------------------
    async def _connect(self, timeout: float) -> aiohttp.ClientWebSocketResponse:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            ws = await asyncio.wait_for(self._session.ws_connect(self._url, headers=headers), timeout)
        except TimeoutError:
            raise APITimeoutError(f"no WebSocket handshake with {self._url} in {timeout:g} s") from None
        except aiohttp.WSServerHandshakeError as exc:
            raise APIStatusError(f"the server refused the WebSocket: {exc.message}", status_code=exc.status,
                                 body=None) from None
        except aiohttp.ClientError as exc:
            raise APIConnectionError(f"cannot connect to {self._url}") from exc
        opts = self._opts
        await ws.send_str(protocol.config_message(
            voice=opts.voice, model=opts.model, speed=opts.speed, instructions=opts.instructions, seed=opts.seed,
            response_format="pcm", sample_rate=self.sample_rate))
        return ws

    @staticmethod
    async def _close_socket(ws: aiohttp.ClientWebSocketResponse) -> None:
        await ws.close()

    @contextlib.asynccontextmanager
    async def _lease(self, timeout: float) -> AsyncIterator[_Lease]:
        """A configured socket for one stream; back to the pool after it, unless it may hold stray events."""
        ws = await self._pool.get(timeout=timeout)
        if ws.closed:  # the server ended the session while it was pooled
            self._pool.remove(ws)
            ws = await self._pool.get(timeout=timeout)
        lease = _Lease(ws)
        try:
            yield lease
        except asyncio.CancelledError:  # the stream was closed: barge-in
            if lease.speaking:
                task = asyncio.ensure_future(self._cancel_and_keep(ws))
                self._settling.add(task)
                task.add_done_callback(self._settling.discard)
            else:
                self._pool.put(ws)
            raise
        except BaseException:
            self._pool.remove(ws)
            raise
        self._pool.put(ws)

    async def _cancel_and_keep(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """input.cancel, then drop what the server still sends until audio.cancelled; then pool the socket."""
        try:
            await ws.send_str(protocol.INPUT_CANCEL)
            async with asyncio.timeout(CANCEL_ACK_S):
                while True:
                    msg = await ws.receive()
                    if msg.type in _CLOSED:
                        raise ConnectionError("the session closed before audio.cancelled")
                    if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data).get("type") == "audio.cancelled":
                        break
        except (Exception, asyncio.CancelledError):  # noqa: BLE001 - any doubt: a fresh socket next time
            self._pool.remove(ws)
        else:
            self._pool.put(ws)


@dataclass
class _Lease:
    ws: aiohttp.ClientWebSocketResponse
    speaking: int = 0  # utterances begun (text sent) and not yet done


async def _speak_utterance(lease: _Lease, emitter: tts.AudioEmitter, sample_rate: int,
                           segment_id: str | None) -> None:
    """Reads one utterance, audio.start to audio.done, into ``emitter`` (a segment when ``segment_id``)."""
    while True:
        msg = await lease.ws.receive()
        if msg.type == aiohttp.WSMsgType.BINARY:
            emitter.push(msg.data)
            continue
        if msg.type in _CLOSED:
            raise APIConnectionError(f"the server closed the session (code {lease.ws.close_code})")
        event = json.loads(msg.data)
        kind = event.get("type")
        if kind == "error":
            err = protocol.ServerError(event)
            raise APIStatusError(err.message, status_code=err.status, request_id=err.request_id, body=event,
                                 retryable=err.retryable)
        if kind == "audio.start":
            if event.get("sample_rate") != sample_rate:
                raise APIError(f"the server speaks at {event.get('sample_rate')} Hz, not {sample_rate}",
                               body=event, retryable=False)
            if segment_id is not None:
                emitter.start_segment(segment_id=segment_id)
        elif kind == "audio.done":
            lease.speaking -= 1
            if segment_id is not None:
                emitter.end_segment()
            else:
                emitter.flush()
            return


class ChunkedStream(tts.ChunkedStream):
    """``synthesize(text)``: the whole text as one utterance on a pooled socket."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(request_id=utils.shortuuid(), sample_rate=self._tts.sample_rate, num_channels=1,
                                  mime_type="audio/pcm")
        async with self._tts._lease(self._conn_options.timeout) as lease:
            lease.speaking += 1
            await lease.ws.send_str(protocol.text_message(self.input_text))
            await lease.ws.send_str(protocol.INPUT_DONE)
            await _speak_utterance(lease, output_emitter, self._tts.sample_rate, None)


class SynthesizeStream(tts.SynthesizeStream):
    """``stream()``: every ``push_text`` is sent at once; ``flush()`` ends the utterance (``input.done``)."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(request_id=utils.shortuuid(), sample_rate=self._tts.sample_rate, num_channels=1,
                                  mime_type="audio/pcm", stream=True)
        async with self._tts._lease(self._conn_options.timeout) as lease:
            segments: asyncio.Queue[str | None] = asyncio.Queue()  # one per utterance, when its text starts

            async def send() -> None:
                segment: str | None = None
                async for item in self._input_ch:
                    if isinstance(item, str):
                        if segment is None:
                            segment = utils.shortuuid()
                            lease.speaking += 1
                            self._mark_started()
                            segments.put_nowait(segment)
                        await lease.ws.send_str(protocol.text_message(item))
                    elif segment is not None:  # a flush after text; an empty one is no utterance
                        await lease.ws.send_str(protocol.INPUT_DONE)
                        segment = None
                if segment is not None:
                    await lease.ws.send_str(protocol.INPUT_DONE)
                segments.put_nowait(None)

            async def receive() -> None:
                while (segment := await segments.get()) is not None:
                    await _speak_utterance(lease, output_emitter, self._tts.sample_rate, segment)

            tasks = [asyncio.create_task(send(), name="cosyserve.send"),
                     asyncio.create_task(receive(), name="cosyserve.receive")]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()  # an error in either ends both
                await asyncio.gather(*tasks)
            finally:
                await utils.aio.cancel_and_wait(*tasks)
