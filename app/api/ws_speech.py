"""``WS /v1/audio/speech/stream``: text in as it is written, audio out as it is spoken.

Client -> server (JSON text frames)::

    {"type": "session.config", "voice": ..., "model": ..., "response_format": "pcm"|"wav"|"mulaw"|...,
     "speed": 1.0, "instructions": ..., "sample_rate": ..., "seed": ...,
     "priority": "interactive"|"bulk"}   (all optional; priority: else X-Priority, else the key's default)
    {"type": "input.text", "text": "any piece of text"}
    {"type": "input.done"}            the utterance's text is complete; the session stays open
    {"type": "input.cancel"}          barge-in: stop speaking, drop what was sent; the session stays open
    {"type": "session.close"}         speak what was sent, then end

Server -> client: ``audio.start`` (utterance, format, sample_rate), binary frames of
audio, ``audio.done`` (utterance, audio_seconds, time_to_first_audio_s),
``audio.cancelled`` (utterance, utterances: the answer to every ``input.cancel``; no
frame of a cancelled utterance follows it), ``session.done``, and ``error`` (``{"type": "error", "error": {code, message,
request_id}}``). A message that is not understood, for whatever reason (not JSON,
nested too deep, too big, a lone surrogate, a field out of range), gets an
``error`` and changes nothing; the session stays open. The protocol reference is
in docs/api.md; the session logic (utterances, permits) in ``app/serving/session.py``.

Capacity: connecting takes no synthesis permit. A session counts against
``websocket.max_sessions``; each utterance takes a permit when it has text and
gives it back when its audio is done. A session lives at most
``websocket.max_session_s``, and ends after ``websocket.idle_timeout_s`` in which
the client sent no text and no audio was produced (other messages, pings,
``session.config``, do not keep it alive).

Close codes: 1000 after ``session.close``, the idle timeout or the session's
lifetime; 1008 after an ``error`` when the ``X-Priority`` header names no class; 1013 (try again later) when ``websocket.max_sessions`` sessions are open,
at once, after an ``error``; 1001 when the server drains (idle sessions at once,
busy ones after their utterances, the rest after ``server.drain_timeout_s``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Literal

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from app.api.context import RequestContext, request_id
from app.api.deps import ContextDep
from app.api.errors import classify
from app.api.openai import check_model
from app.api.priority import client_of, header_priority
from app.api.schemas import PriorityName
from app.audio.formats import FORMATS
from app.runtime import Runtime
from app.serving.admission.classes import Priority, parse_priority
from app.serving.bounds import (
    INSTRUCTIONS_MAX_CHARS,
    NAME_MAX_CHARS,
    OUTPUT_RATE_MAX,
    OUTPUT_RATE_MIN,
    QUOTE_CHARS,
    SPEED_MAX,
    SPEED_MIN,
    quoted,
)
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
from app.serving.speech import CLOSE_WAIT_S

log = logging.getLogger("cosyserve.ws")
router = APIRouter(tags=["streaming"])

PATH = "/v1/audio/speech/stream"
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TRY_AGAIN = 1000, 1001, 1008, 1013
_GONE = (WebSocketDisconnect, RuntimeError, OSError)  # sending to a client that has left
CANCEL_WAIT_S = CLOSE_WAIT_S + 1.0  # input.cancel waits this long for the cancelled job to give its permit back
# The formats whose bytes we write ourselves, so each engine chunk leaves as one binary frame at once:
# pcm, wav, and G.711 (mulaw, alaw, wav_mulaw, wav_alaw: 8 kHz, what phone lines carry).
WS_FORMATS: tuple[str, ...] = tuple(name for name, f in FORMATS.items() if f.container is None)
WsFormat = Literal[WS_FORMATS]  # type: ignore[valid-type]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionConfig(_Message):
    type: Literal["session.config"]
    voice: str | None = Field(None, max_length=NAME_MAX_CHARS)
    model: str | None = Field(None, max_length=NAME_MAX_CHARS)
    response_format: WsFormat = "pcm"
    speed: float = Field(1.0, ge=SPEED_MIN, le=SPEED_MAX)
    instructions: str | None = Field(None, max_length=INSTRUCTIONS_MAX_CHARS)
    sample_rate: int | None = Field(None, ge=OUTPUT_RATE_MIN, le=OUTPUT_RATE_MAX)
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    priority: PriorityName | None = None  # None: the connection's (X-Priority header, API key default)


class InputText(_Message):
    type: Literal["input.text"]
    text: str


class Bare(_Message):
    type: Literal["input.done", "input.cancel", "session.close"]


_KINDS: dict[str, type[_Message]] = {"session.config": SessionConfig, "input.text": InputText,
                                     "input.done": Bare, "input.cancel": Bare, "session.close": Bare}


def parse(raw: str, max_bytes: int | None = None) -> _Message:
    """One client message, or BadRequest saying what is wrong with it; never any other exception."""
    if max_bytes is not None and (len(raw) > max_bytes or len(raw.encode("utf-8", "surrogatepass")) > max_bytes):
        raise BadRequest("invalid_message", f"a message may be at most {max_bytes} bytes; send long text as "
                         "several input.text messages")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deep for the parser
        raise BadRequest("invalid_message", "messages must be JSON objects") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise BadRequest("invalid_message", "a message is a JSON object with a string 'type'", param="type")
    kind = _KINDS.get(data["type"])
    if kind is None:
        raise BadRequest("unknown_type", f"unknown message type {quoted(data['type'])}; use one of "
                         f"{', '.join(_KINDS)}", param="type")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(_short(p) for p in err["loc"]) or "message"
        if err["type"] == "string_unicode":  # a lone surrogate, as add_text and the planner say it
            raise BadRequest("invalid_input", f"{where} holds a lone surrogate (half of a UTF-16 pair): send "
                             "valid Unicode text", param=where) from None
        raise BadRequest("invalid_message", f"{data['type']}: {where}: {err['msg']}", param=where) from None
    except Exception:  # noqa: BLE001 - e.g. RecursionError in a value nested too deep: still one bad message
        raise BadRequest("invalid_message", f"{data['type']}: the message could not be read") from None


def _short(part: object) -> str:
    text = str(part)  # an unknown field's name is the client's: quote a prefix only
    return text if len(text) <= QUOTE_CHARS else f"{text[:QUOTE_CHARS]}..."


@router.websocket(PATH)
async def speech_stream(websocket: WebSocket, ctx: ContextDep) -> None:
    await Connection(websocket, websocket.state.runtime, ctx).serve()


class Connection(SessionConnection):
    """One client's socket: the receive loop here, the audio loop in the session."""

    def __init__(self, ws: WebSocket, runtime: Runtime, ctx: RequestContext | None = None) -> None:
        self.ws = ws
        self.runtime = runtime
        self.ctx = ctx if ctx is not None else RequestContext()  # the key check wrote the key's id and class here
        self.request_id = request_id(ws.headers.get("x-request-id"))
        self.session: SpeechSession | None = None
        self.priority = Priority.INTERACTIVE  # the connection's class (X-Priority, the API key's default)
        self.draining = False
        self.close_code: int | None = None
        self._send_lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self._last = time.monotonic()  # client text or audio produced; the idle timeout counts from here
        self._ends_at = self._last  # set when the session starts: started + websocket.max_session_s
        self._audio_task: asyncio.Task | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    async def serve(self) -> None:
        await self.ws.accept()
        speech, limits, metrics = self.runtime.speech, self.runtime.session_limits, self.runtime.metrics
        started = time.monotonic()
        sessions = self.runtime.sessions
        ctx = self.ctx
        try:
            priority = header_priority(self.ws.scope) or parse_priority(ctx.key_priority or Priority.INTERACTIVE)
        except RequestError as exc:  # an unknown X-Priority: say so; the client may connect again
            await self._error(exc)
            await self._close(CLOSE_POLICY, exc.message)
            return
        self.priority = priority
        try:  # no synthesis permit here: the session counts against its own limit
            self.runtime.open_session(self, limits.max_sessions)
        except ServingError as exc:
            if metrics is not None:
                metrics.on_ws_refused("session_limit" if isinstance(exc, TooManySessions) else "draining")
            await self._error(exc)
            await self._close(CLOSE_GOING_AWAY if isinstance(exc, Draining) else CLOSE_TRY_AGAIN, exc.message)
            return
        if metrics is not None:
            metrics.on_ws_session(True)
        self.session = SpeechSession(speech, limits, self, self.request_id, priority=self.priority,
                                     client=client_of(self.ws.scope, ctx.key_id))
        self._ends_at = started + limits.max_session_s
        self._audio_task = asyncio.ensure_future(self._audio_loop())
        try:
            await self._receive_loop()
        finally:
            sessions.discard(self)
            if metrics is not None:
                metrics.on_ws_session(False)
            self._audio_task.cancel()
            await asyncio.wait({self._audio_task})
            self.session.close()
            await self._close(CLOSE_NORMAL, "")
            log.info("%s WS %s class=%s utterances=%d chars=%d audio=%.2fs %.1fs close=%s", self.request_id, PATH,
                     self.session.priority, self.session.utterances, self.session.chars, self.session.audio_s, time.monotonic() - started,
                     self.close_code if self.close_code is not None else "client")

    async def _receive_loop(self) -> None:
        assert self.session is not None
        limits = self.runtime.session_limits
        idle = limits.idle_timeout_s
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            while True:
                recv = asyncio.ensure_future(self.ws.receive())
                while True:
                    now = time.monotonic()
                    left = min(idle - (now - self._last), self._ends_at - now)
                    done, _ = await asyncio.wait({recv, closed}, timeout=max(0.05, left),
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if done:
                        break
                    now = time.monotonic()
                    if now >= self._ends_at:
                        recv.cancel()
                        await self._error(BadRequest("session_expired", f"a session may last "
                                                     f"{limits.max_session_s:g} s (websocket.max_session_s); "
                                                     "closing: open a new one"))
                        await self._close(CLOSE_NORMAL, "session lifetime reached")
                        return
                    if now - self._last >= idle and not self.session.rendering:
                        recv.cancel()
                        await self._error(BadRequest("idle_timeout", f"no text and no audio for {idle:g} s; "
                                                     "closing"))
                        await self._close(CLOSE_NORMAL, "idle timeout")
                        return
                if recv not in done:
                    recv.cancel()
                    return  # we closed the socket (refused, drained)
                message = recv.result()
                if message["type"] == "websocket.disconnect":
                    return
                if await self._handle(message):
                    return
        finally:
            closed.cancel()

    async def _handle(self, message: dict[str, Any]) -> bool:
        """One client message; True when the session is over."""
        assert self.session is not None
        try:
            if message.get("text") is None:
                raise BadRequest("invalid_message", "binary frames are not accepted: send JSON text messages")
            msg = parse(message["text"], self.runtime.session_limits.max_message_bytes)
            if isinstance(msg, SessionConfig):
                self._configure(msg)
            elif isinstance(msg, InputText):
                self.session.add_text(msg.text)
                self._last = time.monotonic()  # text keeps a session alive; no other client message does
            elif msg.type == "input.done":
                if self.session.flush() is None:
                    raise BadRequest("empty_input", "input.done with no text since the last one: nothing to speak")
            elif msg.type == "input.cancel":
                await self._cancel()
            else:  # session.close
                self.session.finish()
                await asyncio.wait({self._audio_task})
                if self._closed.is_set():
                    return True
                await self._send_json({"type": "session.done", "utterances": self.session.utterances,
                                       "audio_seconds": round(self.session.audio_s, 3)})
                await self._close(CLOSE_NORMAL, "session closed")
                return True
        except RequestError as exc:
            await self._error(exc)
        return False

    def _configure(self, msg: SessionConfig) -> None:
        assert self.session is not None
        if msg.model is not None:
            check_model(self.session.service, msg.model)
        fields = SpeechFields(voice=msg.voice, instructions=msg.instructions, speed=msg.speed, seed=msg.seed,
                              priority=(msg.priority or self.priority).value)
        self.session.configure(fields, msg.response_format, msg.sample_rate)

    async def _cancel(self) -> None:
        """input.cancel: drop what is not yet spoken, wait for its job to give its permit back, acknowledge."""
        assert self.session is not None
        async with self._send_lock:  # no frame is half sent when the utterance's task is cancelled
            dropped = self.session.cancel()
        await self.session.wait_cancelled(CANCEL_WAIT_S)
        if self.runtime.metrics is not None:
            self.runtime.metrics.on_ws_cancel(bool(dropped))
        await self._send_json({"type": "audio.cancelled", "utterance": dropped[0].index if dropped else None,
                               "utterances": [u.index for u in dropped]})
        if dropped:
            log.info("%s WS %s: input.cancel dropped utterances %s", self.request_id, PATH,
                     ",".join(str(u.index) for u in dropped))
        if self.draining and not self.session.busy:
            await self._going_away()

    async def _audio_loop(self) -> None:
        assert self.session is not None
        try:
            await self.session.run()
        except ClientGone:
            return  # the receive loop notices the closed socket
        except SessionRefused as exc:
            await self._error(exc.cause)
            code = CLOSE_GOING_AWAY if isinstance(exc.cause, Draining) else CLOSE_TRY_AGAIN
            await self._close(code, exc.cause.message)
        except Exception:
            log.exception("session %s: audio loop failed", self.request_id)
            await self._close(1011, "internal error")

    # -- drain (SessionRegistry) -----------------------------------------------------------------------
    async def _going_away(self) -> None:
        await self._error(Draining("the server is shutting down"))
        await self._close(CLOSE_GOING_AWAY, "server shutting down")

    # -- SessionSink -------------------------------------------------------------------------------------
    async def audio_start(self, utt: Utterance) -> None:
        out = utt.out
        await self._send_json({"type": "audio.start", "utterance": utt.index, "format": out.format.name,
                               "media_type": out.content_type, "sample_rate": out.sample_rate,
                               "channels": 1, "sample_width": out.format.sample_width}, utt)

    async def audio(self, utt: Utterance, data: bytes) -> None:
        self._last = time.monotonic()
        idle = self.runtime.session_limits.idle_timeout_s
        async with self._send_lock:
            if self._closed.is_set():
                raise ClientGone("the session is closed")
            if utt.cancelled:  # input.cancel came first: none of its audio follows the acknowledgement
                return
            try:
                async with asyncio.timeout(idle):  # a client that reads nothing cannot hold the session
                    await self.ws.send_bytes(data)
            except TimeoutError:  # (before _GONE: TimeoutError is an OSError)
                self._closed.set()  # mid-frame: nothing more can be sent on this socket
                log.info("%s WS %s: the client read no audio for %g s; dropping the session", self.request_id,
                         PATH, idle)
                raise ClientGone(f"the client read no audio for {idle:g} s") from None
            except _GONE:
                self._closed.set()
                raise ClientGone("the client closed the connection") from None

    async def audio_done(self, utt: Utterance) -> None:
        await self._send_json({"type": "audio.done", "utterance": utt.index, "audio_seconds": round(utt.audio_s, 3),
                               "time_to_first_audio_s": None if utt.ttfa_s is None else round(utt.ttfa_s, 4)},
                              utt, end=True)
        self._last = time.monotonic()
        await self._after_utterance()

    async def utterance_failed(self, utt: Utterance, exc: BaseException) -> None:
        await self._error(exc, utterance=utt)
        await self._after_utterance()

    # -- sending -------------------------------------------------------------------------------------------
    async def _error(self, exc: BaseException, utterance: Utterance | None = None) -> None:
        info = classify(exc)
        body: dict[str, Any] = {"code": info.code, "message": info.message, "request_id": self.request_id}
        if info.param:
            body["param"] = info.param
        if info.retry_after_s is not None:
            body["retry_after_s"] = max(1, round(info.retry_after_s))
        event: dict[str, Any] = {"type": "error", "error": body}
        if utterance is not None:
            event["utterance"] = utterance.index
        await self._send_json(event, utterance, end=True)

    async def _send_json(self, data: dict[str, Any], utt: Utterance | None = None, end: bool = False) -> None:
        """One event; an utterance's is dropped once it is cancelled (``end``: its last, it is reported)."""
        async with self._send_lock:
            if self._closed.is_set() or (utt is not None and utt.cancelled):
                return
            if utt is not None and end:
                utt.reported = True  # checked with cancelled, in one step: too late for input.cancel
            try:
                async with asyncio.timeout(self.runtime.session_limits.idle_timeout_s):
                    await self.ws.send_text(json.dumps(data))
            except _GONE:  # the client is gone, or read nothing for the idle timeout (TimeoutError)
                self._closed.set()

    async def _close(self, code: int, reason: str) -> None:
        async with self._send_lock:
            if self._closed.is_set():
                return
            self._closed.set()
            self.close_code = code
            if self.ws.application_state == WebSocketState.CONNECTED and \
                    self.ws.client_state == WebSocketState.CONNECTED:
                try:
                    async with asyncio.timeout(self.runtime.session_limits.idle_timeout_s):
                        await self.ws.close(code, reason[:120])
                except _GONE:  # gone, or not reading (TimeoutError)
                    pass
