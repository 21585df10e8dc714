"""A streaming speech session: utterances of text that arrives over time, spoken one after another.

The WebSocket surface (``app/api/ws_speech.py``) parses messages and calls::

    session = SpeechSession(service, limits, sink)
    session.configure(fields, "wav", None)                    # between utterances only
    session.add_text("Hello wor")                              # opens an utterance at once
    session.flush()                                            # input.done: its text is complete
    session.cancel()                                           # input.cancel: drop what is not yet spoken
    await session.run()                                        # the audio loop (a task), until finish()

Each utterance is one synthesis job (``SpeechService.run`` with a ``TextStream`` as
its text), so admission, the FIFO queue, the deadline and cancellation work as for
any request. The job starts at the first text, so an engine that can (CosyVoice2/3
bistream) starts speaking before the text is complete. A session holds no
synthesis permit of its own: each utterance takes one when it has text to speak
(its first ``input.text``) and gives it back when its audio is done, so sessions
that send no text hold no synthesis capacity (they count against
``SessionLimits.max_sessions`` instead, see :class:`SessionRegistry`). An
utterance refused for overload fails alone (the session goes on); draining or a
pool that is not ready ends the session (:class:`SessionRefused`); every other
failure ends only its utterance and is reported to the sink.

Barge-in: ``cancel()`` drops every utterance not yet fully spoken (the one being
spoken, any queued behind it, the one taking text). Each utterance is spoken in a
task of its own, and cancelling that task is the same path as an HTTP client that
leaves: a queued job leaves the queue, a running one gets the engine's cancel flag
(its LLM row leaves the batch at the next step, its flow hops stop), and the job
gives back its slot and permit once the slot thread has returned
(``wait_cancelled`` waits for that). The sink drops whatever a cancelled utterance
still hands it (``Utterance.cancelled``); ``Utterance.reported`` marks one whose end
the client has been told already, which is then no longer cancellable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

from app.engines.base import EngineError
from app.serving.admission.classes import Priority
from app.serving.bounds import check_unicode
from app.serving.encoded import OutputSpec
from app.serving.errors import (
    BadRequest,
    ClientGone,
    Draining,
    NotReady,
    Overloaded,
    RequestError,
    ServingError,
)
from app.serving.plan import Plan, SpeechFields
from app.serving.speech import SpeechService
from app.text.stream import TextStream

log = logging.getLogger("cosyserve.session")


@dataclass(frozen=True)
class SessionLimits:
    idle_timeout_s: float  # no client text and no audio produced for this long: the session ends
    max_session_chars: int  # text one session may send in all
    max_utterance_chars: int  # text of one utterance (server.max_text_chars)
    max_sessions: int  # open sessions at once; the next is refused (error, close 1013)
    max_session_s: float  # a session's whole life, busy or not; then it is closed
    max_message_bytes: int  # one client message; a bigger one is refused (invalid_message)


class TooManySessions(Overloaded):
    """``max_sessions`` sessions are open: a new one is refused at connect."""


@dataclass(eq=False)
class Utterance:
    index: int
    text: TextStream = field(default_factory=TextStream)
    opened_at: float = field(default_factory=time.monotonic)  # its first text arrived
    out: OutputSpec | None = None
    ttfa_s: float | None = None  # first text -> first audio byte handed to the sink
    audio_s: float = 0.0
    bytes_sent: int = 0
    finished: bool = False
    cancelled: bool = False  # input.cancel dropped it: the sink sends nothing more of it
    reported: bool = False  # the sink has told the client its end (audio.done or error): too late to cancel


class SessionRefused(Exception):
    """An utterance could not get an admission permit; the session must end."""

    def __init__(self, cause: ServingError) -> None:
        super().__init__(cause.message)
        self.cause = cause


class SessionSink(Protocol):
    async def audio_start(self, utt: Utterance) -> None: ...

    async def audio(self, utt: Utterance, data: bytes) -> None: ...

    async def audio_done(self, utt: Utterance) -> None: ...

    async def utterance_failed(self, utt: Utterance, exc: BaseException) -> None: ...


_ENDS_SESSION = (Draining, NotReady)
SURFACE_NAMES = {"websocket": "WebSocket sessions", "wyoming": "Wyoming connections"}


class SpeechSession:
    def __init__(self, service: SpeechService, limits: SessionLimits, sink: SessionSink, request_id: str = "",
                 priority: Priority = Priority.INTERACTIVE, client: str = "") -> None:
        self.service = service
        self.limits = limits
        self.sink = sink
        self.request_id = request_id
        self.priority = priority  # the connection's class (X-Priority, the API key's default); session.config may change it
        self.client = client  # whose session (the API key's id, else the address): fairness between bulk clients
        try:  # the default voice; a model without presets needs session.config first
            self._plan: Plan | None = service.plan(SpeechFields(stream=True, aliases=True, priority=priority.value),
                                                   request_id)
        except BadRequest:
            self._plan = None
        self._out: OutputSpec = service.output("pcm", stream=True)
        self._queue: asyncio.Queue[Utterance | None] = asyncio.Queue()
        self._open: Utterance | None = None  # taking text now
        self._speaking: tuple[Utterance, asyncio.Task[None]] | None = None  # the one being spoken, its own task
        self._stopping: asyncio.Task[None] | None = None  # the last one cancel() cancelled
        self._unfinished: list[Utterance] = []  # opened, not yet fully spoken
        self.utterances = 0  # opened so far
        self.chars = 0
        self.audio_s = 0.0

    # -- what the client says -----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """An utterance is open or not yet fully spoken (a cancelled one no longer counts)."""
        return self.unfinished > 0

    @property
    def unfinished(self) -> int:
        """Utterances opened and not yet fully spoken, nor cancelled. One whose end the client has been told
        (audio.done, or its error) no longer counts, though its job may still be closing."""
        return sum(not (u.cancelled or u.reported) for u in self._unfinished)

    @property
    def rendering(self) -> bool:
        """A flushed utterance is still being spoken (the client has nothing to send meanwhile)."""
        return any(u.text.ended and not (u.cancelled or u.reported) for u in self._unfinished)

    @property
    def output(self) -> OutputSpec:
        return self._out

    def configure(self, fields: SpeechFields, fmt: str, sample_rate: int | None) -> None:
        """Voice, format, speed ... for the next utterances; on any error nothing changes."""
        if self.busy:
            raise BadRequest("session_busy", "session.config is accepted only between utterances (after "
                             "audio.done)")
        fields.stream, fields.aliases = True, True
        plan = self.service.plan(fields, self.request_id)
        out = self.service.output(fmt, stream=True, sample_rate=sample_rate)
        self._plan, self._out = plan, out
        self.priority = Priority(plan.request.priority)

    def add_text(self, text: str) -> Utterance:
        if self._plan is None:
            raise BadRequest("voice_required", "this model has no preset speakers: send session.config with a "
                             "registered voice first", param="voice")
        check_unicode(text, "text")
        utt = self._open
        held = utt.text.chars if utt is not None else 0
        if held + len(text) > self.limits.max_utterance_chars:
            raise BadRequest("text_too_long", f"this utterance would have {held + len(text)} characters; the limit "
                             f"is {self.limits.max_utterance_chars} (send input.done to speak what you sent)",
                             param="text")
        if self.chars + len(text) > self.limits.max_session_chars:
            raise BadRequest("session_text_limit", f"this session has sent {self.chars} characters; the limit is "
                             f"{self.limits.max_session_chars} per session", param="text")
        if utt is None:
            self.utterances += 1
            utt = self._open = Utterance(self.utterances, out=self._out)
            self._unfinished.append(utt)
            self._queue.put_nowait(utt)
        utt.text.put(text)
        self.chars += len(text)
        return utt

    def flush(self) -> Utterance | None:
        """input.done: the open utterance's text is complete; None when no utterance is open."""
        utt, self._open = self._open, None
        if utt is not None:
            utt.text.end()
        return utt

    def finish(self) -> None:
        """session.close: flush, then ``run`` returns once everything sent so far is spoken."""
        self.flush()
        self._queue.put_nowait(None)

    def cancel(self) -> list[Utterance]:
        """input.cancel: drop every utterance not yet reported to the client; returns them, oldest first.

        Synchronous, so the sink sees the flags before it sends anything more; the job of the one
        being spoken is cancelled (``wait_cancelled`` waits until it has given its slot and permit back).
        """
        dropped = [u for u in self._unfinished if not (u.cancelled or u.reported)]
        speaking = self._speaking if self._speaking is not None and self._speaking[0] in dropped else None
        for utt in dropped:
            utt.cancelled = True
            if speaking is None or utt is not speaking[0]:
                utt.text.end()  # never spoken; the one being spoken stops on its cancel flag (no last words)
        self._open = None
        if speaking is not None:
            self._stopping = speaking[1]
            self._stopping.cancel()
        return dropped

    async def wait_cancelled(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until a cancelled utterance's task has closed its job."""
        task, self._stopping = self._stopping, None
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=timeout_s)

    def close(self) -> None:
        """The session is over (any path): stop waiting engines (their jobs give their permits back)."""
        for utt in self._unfinished:
            utt.text.end()
        self._open = None

    # -- the audio loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        """Speak the utterances in order until ``finish``; SessionRefused when the server drains."""
        while True:
            utt = await self._queue.get()
            if utt is None:
                return
            try:
                if not utt.cancelled:
                    await self._speak_cancellable(utt)
            finally:
                utt.finished = True
                self._unfinished.remove(utt)

    async def _speak_cancellable(self, utt: Utterance) -> None:
        """``_speak`` in a task of its own, which ``cancel`` may cancel without ending the audio loop."""
        task = asyncio.ensure_future(self._speak(utt))
        self._speaking = (utt, task)
        try:
            await asyncio.wait({task})
        finally:
            if not task.done():  # the audio loop itself is cancelled (the session ends): close the job too
                task.cancel()
                await asyncio.wait({task})
            self._speaking = None
        if not task.cancelled():
            task.result()  # ClientGone, SessionRefused: the session ends

    async def _speak(self, utt: Utterance) -> None:
        assert self._plan is not None
        req = replace(self._plan.request, text_stream=utt.text, stream=True,
                      request_id=f"{self.request_id}-{utt.index}")
        try:  # the utterance has text: it takes a synthesis permit now (bulk: waits its turn), its job gives it back
            ticket = await self.service.pool.gate.admit(Priority(req.priority), self.client)
        except _ENDS_SESSION as exc:
            raise SessionRefused(exc) from None
        except Overloaded as exc:  # this utterance only: the client may send it again
            await self.sink.utterance_failed(utt, exc)
            return
        try:
            result = await self.service.run(Plan(req), utt.out, ticket=ticket)
        except (RequestError, ServingError, EngineError) as exc:
            if isinstance(exc, ClientGone):
                raise
            await self.sink.utterance_failed(utt, exc)
            return
        try:
            started = False
            assert result.body is not None
            async for data in result.body:
                if not started:
                    started = True
                    utt.ttfa_s = time.monotonic() - utt.opened_at
                    await self.sink.audio_start(utt)
                utt.bytes_sent += len(data)
                await self.sink.audio(utt, data)
            utt.audio_s = result.audio_s
            if not started:
                await self.sink.audio_start(utt)
            await self.sink.audio_done(utt)
        except (RequestError, ServingError, EngineError) as exc:  # after the first byte
            if isinstance(exc, ClientGone):
                raise
            log.warning("session %s utterance %d failed mid-stream: %r", self.request_id, utt.index, exc)
            await self.sink.utterance_failed(utt, exc)
        finally:
            self.audio_s += result.audio_s  # what was sent, whole or not: the access line reports it
            await result.aclose()


class SessionConnection:
    """A client connection that drives a ``SpeechSession`` (the WebSocket route, Wyoming): how the
    ``SessionRegistry`` drains it. A subclass sets ``session`` and ``_audio_task`` and says how it goes
    away (``_going_away``: its transport's error, then the close); it calls ``_after_utterance`` when
    an utterance is reported."""

    session: SpeechSession | None = None
    draining = False
    _audio_task: asyncio.Task | None = None

    async def drain(self) -> None:
        """Server drain: end now if idle, else after the utterances already sent (see _after_utterance)."""
        self.draining = True
        if self.session is not None and not self.session.busy:
            await self._going_away()

    async def force_close(self) -> None:
        if self._audio_task is not None:
            self._audio_task.cancel()
        await self._going_away()

    async def _going_away(self) -> None:
        raise NotImplementedError

    async def _after_utterance(self) -> None:
        if self.draining and self.session is not None and self.session.unfinished == 0:  # this one is reported
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._going_away()))


class SessionRegistry:
    """The live sessions of one server, for their limits and the drain: each entry has ``drain()`` and
    ``force_close()``, and belongs to one surface (``websocket``, ``wyoming``), counted against its own limit."""

    def __init__(self) -> None:
        self._live: dict[object, str] = {}  # handle -> its surface
        self._changed: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._live)

    def count(self, surface: str) -> int:
        return sum(1 for s in self._live.values() if s == surface)

    def add(self, handle: object, limit: int | None = None, surface: str = "websocket") -> None:
        """Count ``handle`` in; TooManySessions when ``limit`` sessions of its surface are open already."""
        if limit is not None and handle not in self._live and (open_ := self.count(surface)) >= limit:
            raise TooManySessions(f"{open_} {SURFACE_NAMES.get(surface, surface)} are open, the most this server "
                                  f"takes ({surface}.max_sessions); try again later")
        self._live[handle] = surface

    def discard(self, handle: object) -> None:
        self._live.pop(handle, None)
        if self._changed is not None:
            self._changed.set()

    async def drain(self, timeout_s: float) -> int:
        """Ask every session to end after its current utterances; force-close the rest after ``timeout_s``.

        Returns how many had to be force-closed.
        """
        self._changed = asyncio.Event()
        for handle in list(self._live):
            await handle.drain()
        deadline = time.monotonic() + timeout_s
        while self._live and time.monotonic() < deadline:
            self._changed.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._changed.wait()
            except TimeoutError:
                break
        late = list(self._live)
        for handle in late:
            await handle.force_close()
        return len(late)
