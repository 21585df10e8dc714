"""One Wyoming client's connection: its events drive a ``SpeechSession``, the session's audio goes back as events.

Client -> server: ``describe`` (answered with ``info``), ``synthesize`` (one text), ``synthesize-start`` /
``synthesize-chunk`` / ``synthesize-stop`` (text as it is written), ``ping`` (``pong``). A ``synthesize``
between ``synthesize-start`` and ``synthesize-stop`` is the whole text that the chunks carry too (the
protocol's copy for servers that do not stream) and is ignored. Other events are dropped, as the protocol
asks.

Server -> client: each utterance as ``audio-start``, ``audio-chunk`` (raw s16le mono PCM at the model's
rate), ``audio-stop``; a streamed one then ``synthesize-stopped``. A request that fails (over capacity,
text too long, an unknown voice, the engine) gets an ``error`` event (``code`` as the HTTP API's) instead
of its ``audio-stop``. A streamed one still ends with ``synthesize-stopped`` and the connection stays open;
after a one-text ``synthesize``'s error the connection is closed, because Home Assistant's client reads no
``error`` event and would otherwise wait for an ``audio-stop`` that never comes. The utterances are the WebSocket route's: each takes a synthesis permit from the one admission gate
when it has text, so admission, classes, text limits and the drain are the same (``app/serving/session.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from app.api.context import request_id
from app.api.errors import classify
from app.runtime import Runtime
from app.serving.errors import (
    BadRequest,
    ClientGone,
    Draining,
    RequestError,
    ServingError,
)
from app.serving.plan import SpeechFields
from app.serving.session import (
    SessionConnection,
    SessionRefused,
    SpeechSession,
    TooManySessions,
    Utterance,
)
from app.wyoming.config import WyomingConfig
from app.wyoming.info import describe

log = logging.getLogger("cosyserve.wyoming")

SURFACE = "wyoming"
_GONE = (OSError, RuntimeError, ConnectionError)  # writing to a client that has left


class CappedReader:
    """What ``async_read_event`` reads from, every length it is told capped.

    The header line is capped by the stream's own limit (``asyncio.start_server(limit=...)``); a
    ``data_length`` or ``payload_length`` above ``max_bytes`` is refused here before a byte is read,
    where the package would buffer as many bytes as the client names.
    """

    def __init__(self, reader: asyncio.StreamReader, max_bytes: int) -> None:
        self._reader = reader
        self.max_bytes = max_bytes
        self.refused = False

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def readexactly(self, n: int) -> bytes:
        if not isinstance(n, int) or n > self.max_bytes:
            self.refused = True
            raise ValueError("event too large")  # async_read_event answers None: the connection ends
        return await self._reader.readexactly(n)


@dataclass(eq=False)
class _Stream:
    """A request streamed in (``synthesize-start`` until ``synthesize-stop``)."""

    utt: Utterance | None = None  # its utterance, once its first text arrived
    failed: bool = False  # its error was sent: later chunks are dropped


class WyomingConnection(SessionConnection):
    """One client: the receive loop here, the audio loop in the session; a ``SessionSink`` and a registry entry."""

    def __init__(self, reader: CappedReader, writer: asyncio.StreamWriter, runtime: Runtime, config: WyomingConfig,
                 version: str | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.runtime = runtime
        self.config = config
        self.version = version
        peer = writer.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else "-"
        self.request_id = request_id(None)
        self.session: SpeechSession | None = None
        self.draining = False
        self._send_lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self._last = time.monotonic()  # client text or audio produced; the idle timeout counts from here
        self._ends_at = self._last + config.limits.max_session_s
        self._audio_task: asyncio.Task | None = None
        self._voice: str | None = None  # the voice configured last (None: the default)
        self._stream: _Stream | None = None
        self._stop_after: set[Utterance] = set()  # streamed utterances whose synthesize-stop has arrived
        self._modes: dict[Utterance, str] = {}  # each utterance's request kind, for the metrics

    # -- lifecycle -----------------------------------------------------------------------------------
    async def serve(self) -> None:
        metrics, started = self.runtime.metrics, time.monotonic()
        try:  # no synthesis permit here: the connection counts against wyoming.max_sessions
            self.runtime.open_session(self, self.config.limits.max_sessions, SURFACE)
        except ServingError as exc:
            if metrics is not None:
                metrics.on_wyoming_refused("session_limit" if isinstance(exc, TooManySessions) else "draining")
            await self._error(exc)
            await self._close()
            return
        if metrics is not None:
            metrics.on_wyoming_connection(True)
        speech = self.runtime.speech
        self.session = SpeechSession(speech, self.config.limits, self, self.request_id,
                                     priority=self.config.priority, client=self.client)
        self._audio_task = asyncio.ensure_future(self._audio_loop())
        try:
            await self._receive_loop()
        finally:
            self.runtime.sessions.discard(self)
            if metrics is not None:
                metrics.on_wyoming_connection(False)
            self._audio_task.cancel()
            await asyncio.wait({self._audio_task})
            self.session.close()
            await self._close()
            log.info("%s Wyoming %s class=%s utterances=%d chars=%d audio=%.2fs %.1fs", self.request_id,
                     self.client, self.session.priority, self.session.utterances, self.session.chars,
                     self.session.audio_s, time.monotonic() - started)

    async def _receive_loop(self) -> None:
        assert self.session is not None
        limits = self.config.limits
        closed = asyncio.ensure_future(self._closed.wait())
        read: asyncio.Future | None = None
        try:
            while True:
                if read is None:  # never cancelled mid-event: a partly read event would lose its framing
                    read = asyncio.ensure_future(self._read())
                now = time.monotonic()
                left = min(limits.idle_timeout_s - (now - self._last), self._ends_at - now)
                done, _ = await asyncio.wait({read, closed}, timeout=max(0.05, left),
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    now = time.monotonic()
                    if now >= self._ends_at:
                        await self._error(BadRequest("session_expired", f"a connection may last "
                                                     f"{limits.max_session_s:g} s (websocket.max_session_s); "
                                                     "closing: connect again"))
                        return
                    if now - self._last >= limits.idle_timeout_s and not self.session.rendering:
                        return  # an idle client: close quietly, it connects again for its next request
                    continue
                if read not in done:
                    return  # we closed the connection (drained)
                event, read = read.result(), None
                if event is None:
                    if self.reader.refused:
                        await self._error(BadRequest("event_too_large", f"an event's data and payload may be at "
                                                     f"most {self.reader.max_bytes} bytes each "
                                                     "(wyoming.max_event_bytes); closing"))
                    return
                await self._handle(event)
        finally:
            closed.cancel()
            if read is not None:
                read.cancel()

    async def _read(self) -> Event | None:
        """The next event; None at the end of the stream or at an event that cannot be read (then closed)."""
        try:
            return await async_read_event(self.reader)  # type: ignore[arg-type]
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        except Exception:  # noqa: BLE001 - a header that is JSON but not an event: its framing is lost
            log.info("%s Wyoming %s: an event that could not be read; closing", self.request_id, self.client)
            return None

    async def _audio_loop(self) -> None:
        assert self.session is not None
        try:
            await self.session.run()
        except ClientGone:
            return
        except SessionRefused as exc:  # draining, or the pool is not ready: the connection ends
            await self._error(exc.cause)
            await self._close()
        except Exception:
            log.exception("%s Wyoming: audio loop failed", self.request_id)
            await self._close()

    # -- events ------------------------------------------------------------------------------------------
    async def _handle(self, event: Event) -> None:
        assert self.session is not None
        kind = event.type
        if not isinstance(kind, str):
            return  # not an event of any protocol: dropped like an unknown one
        mode = "stream" if kind.startswith("synthesize-") else "synthesize"
        try:
            if Describe.is_type(kind):
                await self._send(describe(self.session.service, self.version).event())
            elif Ping.is_type(kind):
                text = event.data.get("text") if isinstance(event.data, dict) else None
                await self._send(Pong(text=text if isinstance(text, str) else None).event())
            elif Synthesize.is_type(kind):
                if self._stream is None:  # else: the streamed text's copy for servers that do not stream
                    await self._synthesize(_read_event(Synthesize, event))
            elif SynthesizeStart.is_type(kind):
                if self._stream is not None:
                    raise BadRequest("stream_open", "synthesize-start while another is open: send synthesize-stop "
                                     "first")
                self._stream = _Stream()
                try:
                    self._configure(_read_event(SynthesizeStart, event).voice)
                except RequestError:
                    self._stream.failed = True
                    raise
            elif SynthesizeChunk.is_type(kind):
                self._chunk(_read_event(SynthesizeChunk, event).text)
            elif SynthesizeStop.is_type(kind):
                await self._stop()
            # anything else: dropped, as the protocol asks of a server that does not know it
        except RequestError as exc:
            if kind.startswith("synthesize") and self.runtime.metrics is not None:
                self.runtime.metrics.on_wyoming_synthesis(mode, "client_error")
            await self._error(exc)
            if Synthesize.is_type(kind):
                await self._close()  # a one-text request's client waits for audio-stop or the close

    async def _synthesize(self, request: Synthesize) -> None:
        assert self.session is not None
        if not request.text.strip():
            raise BadRequest("empty_input", "synthesize with no text: nothing to speak", param="text")
        self._configure(request.voice)
        utt = self.session.add_text(request.text)
        self._modes[utt] = "synthesize"
        self.session.flush()
        self._last = time.monotonic()

    def _chunk(self, text: str) -> None:
        assert self.session is not None
        stream = self._stream
        if stream is None:
            raise BadRequest("no_stream", "synthesize-chunk outside synthesize-start ... synthesize-stop")
        if stream.failed:
            return  # its error was sent; synthesize-stop ends it
        try:
            utt = self.session.add_text(text)
        except RequestError:
            stream.failed = True
            if stream.utt is not None:
                self._modes.pop(stream.utt, None)
                self.session.cancel()  # the utterance would be cut short: drop it and say why
            raise
        stream.utt = utt
        self._modes[utt] = "stream"
        self._last = time.monotonic()

    async def _stop(self) -> None:
        assert self.session is not None
        stream, self._stream = self._stream, None
        if stream is None:
            raise BadRequest("no_stream", "synthesize-stop without synthesize-start")
        self.session.flush()
        utt = stream.utt
        if stream.failed or utt is None or utt.reported or utt.cancelled:
            await self._send(SynthesizeStopped().event())  # nothing (more) to speak: the request ends here
        else:
            self._stop_after.add(utt)  # synthesize-stopped follows its audio-stop (or its error)

    def _configure(self, voice: SynthesizeVoice | None) -> None:
        """The request's voice (by name; a language alone keeps the voice: CosyVoice reads it from the text)."""
        assert self.session is not None
        name = voice.name if voice is not None else None
        if name == self._voice:
            return
        fields = SpeechFields(voice=name, priority=self.config.priority.value)
        self.session.configure(fields, "pcm", None)
        self._voice = name

    # -- drain (SessionRegistry) -------------------------------------------------------------------------
    async def _going_away(self) -> None:
        await self._error(Draining("the server is shutting down"))
        await self._close()

    # -- SessionSink -------------------------------------------------------------------------------------
    async def audio_start(self, utt: Utterance) -> None:
        assert utt.out is not None
        await self._send(AudioStart(rate=utt.out.sample_rate, width=utt.out.format.sample_width, channels=1).event(),
                         utt)

    async def audio(self, utt: Utterance, data: bytes) -> None:
        assert utt.out is not None
        self._last = time.monotonic()
        rate, width = utt.out.sample_rate, utt.out.format.sample_width
        step = self.config.samples_per_chunk * width
        for at in range(0, len(data), step):
            chunk = AudioChunk(rate=rate, width=width, channels=1, audio=data[at:at + step])
            await self._send(chunk.event(), utt, audio=True)

    async def audio_done(self, utt: Utterance) -> None:
        await self._send(AudioStop().event(), utt, end=True)
        self._last = time.monotonic()
        self._finished(utt, "ok")
        if utt in self._stop_after:
            self._stop_after.discard(utt)
            await self._send(SynthesizeStopped().event())
        await self._after_utterance()

    async def utterance_failed(self, utt: Utterance, exc: BaseException) -> None:
        status = classify(exc).status
        one_text = self._modes.get(utt) == "synthesize"
        self._finished(utt, "rejected" if status == 503 else "client_error" if 400 <= status < 500 else "error")
        await self._error(exc, utt)
        if one_text:
            await self._close()  # its client (Home Assistant's) waits for audio-stop or the close: close
            return
        if self._stream is not None and self._stream.utt is utt:
            self._stream.failed = True  # still taking text: synthesize-stop ends it
        elif utt in self._stop_after:
            self._stop_after.discard(utt)
            await self._send(SynthesizeStopped().event())
        await self._after_utterance()

    def _finished(self, utt: Utterance, outcome: str) -> None:
        mode = self._modes.pop(utt, None)
        if mode is not None and self.runtime.metrics is not None:
            self.runtime.metrics.on_wyoming_synthesis(mode, outcome)

    # -- sending -------------------------------------------------------------------------------------------
    async def _error(self, exc: BaseException, utt: Utterance | None = None) -> None:
        info = classify(exc)
        await self._send(Error(text=info.message, code=info.code).event(), utt, end=True)

    async def _send(self, event: Event, utt: Utterance | None = None, end: bool = False, audio: bool = False) -> None:
        """One event; an utterance's are dropped once it is cancelled (``end``: its last, it is reported).

        ``audio``: ClientGone when the client has left or reads nothing for the idle timeout, so the
        utterance's job stops; other events are dropped then.
        """
        async with self._send_lock:
            if self._closed.is_set():
                if audio:
                    raise ClientGone("the connection is closed")
                return
            if utt is not None and utt.cancelled:
                return
            if utt is not None and end:
                utt.reported = True
            try:
                async with asyncio.timeout(self.config.limits.idle_timeout_s):
                    await async_write_event(event, self.writer)
            except (TimeoutError, *_GONE):  # gone, or read nothing for the idle timeout
                self._closed.set()
                if audio:
                    raise ClientGone("the client left or read no audio") from None

    async def _close(self) -> None:
        async with self._send_lock:
            self._closed.set()
            if self.writer.is_closing():
                return
            self.writer.close()
        try:
            async with asyncio.timeout(1.0):
                await self.writer.wait_closed()
        except (TimeoutError, *_GONE):
            pass


def _read_event(kind: Any, event: Event) -> Any:
    """``kind.from_event(event)``, or BadRequest when its data is not what the protocol says."""
    try:
        parsed = kind.from_event(event)
    except Exception:  # noqa: BLE001 - data of the wrong shape (not a dict, a missing field)
        raise BadRequest("invalid_event", f"{event.type}: its data could not be read") from None
    text = getattr(parsed, "text", "")
    voice = getattr(parsed, "voice", None)
    if not isinstance(text, str) or (voice is not None and not isinstance(voice.name, str | None)):
        raise BadRequest("invalid_event", f"{event.type}: text and voice names must be strings")
    return parsed
