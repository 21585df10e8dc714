"""A Pipecat TTS service on cosyserve's ``WS /v1/audio/speech/stream``: the LLM's tokens in as they come.

``CosyserveTTSService(base_url="http://HOST:8000", voice=...)`` streams tokens by default
(``TextAggregationMode.TOKEN``): each piece of an LLM turn is an ``input.text`` at once, the end of
the turn an ``input.done``; the PCM frames come back as ``TTSAudioRawFrame`` of the turn's context.
One socket for the service's life: a turn is one utterance of the session, and the server speaks
them in order, so the service pairs each ``audio.start`` with the oldest turn still unspoken.

Barge-in: on an ``InterruptionFrame`` Pipecat drops the turn's audio context and calls
``on_audio_context_interrupted``; the service sends ``input.cancel`` and drops audio until
``audio.cancelled``, keeping the socket (no reconnect, unlike ``InterruptibleTTSService``).
A server ``error`` becomes an ``ErrorFrame``; after a refused ``session.config`` (an unknown voice)
the service speaks nothing, rather than in the server's default voice, until its settings change.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any

from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from websockets.protocol import State

from cosyserve_plugins import protocol

SAMPLE_RATE = 24000  # CosyVoice2/3's own rate; the server resamples to any other asked for
# Errors that refuse the session's settings (they carry no utterance): nothing may be spoken with them.
_CONFIG_ERRORS = {"unknown_voice", "model_not_found", "voice_required"}


class CosyserveTTSService(WebsocketTTSService):
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
        **kwargs: Any,
    ) -> None:
        """``voice``: a library voice, preset or OpenAI name (None: the server's first preset).
        ``sample_rate``: the frames' rate, 8000-48000, resampled by the server. Other keyword
        arguments go to Pipecat's ``TTSService`` (``text_aggregation_mode`` among them)."""
        kwargs.setdefault("text_aggregation_mode", TextAggregationMode.TOKEN)
        super().__init__(push_start_frame=True, push_stop_frames=False, sample_rate=sample_rate,
                         settings=TTSSettings(model=model, voice=voice, language=None), **kwargs)
        self._url = protocol.stream_url(base_url)
        self._api_key = api_key
        self._speed, self._instructions, self._seed = speed, instructions, seed
        self._receive_task = None
        self._unspoken: deque[str] = deque()  # contexts whose utterance is begun and not done, oldest first
        self._open: str | None = None  # the context whose utterance still takes text
        self._speaking: str | None = None  # the context of the audio now arriving
        self._dropping = False  # input.cancel sent, audio.cancelled not yet read
        self._refused: str | None = None  # why session.config was refused

    def can_generate_metrics(self) -> bool:
        return True

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)  # sets the sample rate that session.config asks for
        await self._connect()

    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:
        changed = await super()._update_settings(delta)
        if "voice" in changed or "model" in changed:  # a new session.config: only between utterances
            await self._disconnect()
            await self._connect()
        return changed

    # -- the socket ---------------------------------------------------------------------------------
    async def _connect(self) -> None:
        await super()._connect()
        if self._receive_task is not None and (self._websocket is None or self._websocket.state is not State.OPEN):
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._connect_websocket()
        if self._websocket is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._websocket is not None and self._websocket.state is State.OPEN:
            return
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            self._websocket = await self._websocket_connect(self._url, additional_headers=headers)
            await self._websocket.send(protocol.config_message(
                voice=self._settings.voice, model=self._settings.model, speed=self._speed,
                instructions=self._instructions, seed=self._seed, response_format="pcm",
                sample_rate=self.sample_rate))
        except Exception as exc:  # noqa: BLE001 - reported as Pipecat reports a failed connection
            self._websocket = None
            await self.push_error(error_msg=f"cannot connect to {self._url}: {exc}", exception=exc)
            await self._call_event_handler("on_connection_error", str(exc))
            return
        self._unspoken.clear()
        self._open = self._speaking = self._refused = None
        self._dropping = False
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        try:
            await self.stop_all_metrics()
            if self._websocket is not None:
                await self._websocket.close()
        finally:
            self._websocket = None
            await self._call_event_handler("on_disconnected")

    # -- text out ---------------------------------------------------------------------------------------
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        if self._websocket is None or self._websocket.state is not State.OPEN:
            await self._connect()
        if self._refused is not None or self._websocket is None:
            yield ErrorFrame(error=f"cosyserve: nothing spoken: {self._refused or 'not connected'}")
            return
        if self._open != context_id:  # the turn's first text opens its utterance
            if self._open is not None:
                await self._websocket.send(protocol.INPUT_DONE)
            self._open = context_id
            self._unspoken.append(context_id)
        await self._websocket.send(protocol.text_message(text))
        await self.start_tts_usage_metrics(text)
        yield None  # the audio comes on the receive task

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The end of the turn: ``input.done`` ends its utterance; the session stays open."""
        if self._open is None or (context_id is not None and context_id != self._open):
            return
        self._open = None
        if self._websocket is not None:
            await self._websocket.send(protocol.INPUT_DONE)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: one ``input.cancel`` drops every unspoken utterance; audio is dropped until its answer."""
        if self._unspoken and self._websocket is not None:
            self._unspoken.clear()
            self._open = self._speaking = None
            self._dropping = True
            await self._websocket.send(protocol.INPUT_CANCEL)
        await self.stop_all_metrics()
        await super().on_audio_context_interrupted(context_id)

    # -- audio in ---------------------------------------------------------------------------------------
    async def _receive_messages(self) -> None:
        async for message in self._websocket:
            if isinstance(message, bytes):
                await self._audio(message)
            else:
                await self._event(json.loads(message))

    async def _audio(self, data: bytes) -> None:
        ctx = self._speaking
        if self._dropping or ctx is None or not self.audio_context_available(ctx):
            return
        await self.stop_ttfb_metrics()
        await self.append_to_audio_context(ctx, TTSAudioRawFrame(audio=data, sample_rate=self.sample_rate,
                                                                  num_channels=1, context_id=ctx))

    async def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "audio.cancelled":
            self._dropping = False
        elif self._dropping:
            return  # the cancelled utterances' last events
        elif kind == "audio.start":
            self._speaking = self._unspoken[0] if self._unspoken else None
        elif kind == "audio.done":
            self._speaking = None
            await self._end_oldest()
        elif kind == "error":
            err = protocol.ServerError(event)
            if err.utterance is not None:
                await self._end_oldest()
            elif err.code in _CONFIG_ERRORS:
                self._refused = f"{err.code}: {err.message}"
            await self.push_error(error_msg=f"cosyserve: {err.code}: {err.message}")

    async def _end_oldest(self) -> None:
        if not self._unspoken:
            return
        ctx = self._unspoken.popleft()
        if self._open == ctx:
            self._open = None
        if self.audio_context_available(ctx):
            await self.append_to_audio_context(ctx, TTSStoppedFrame(context_id=ctx))
            await self.remove_audio_context(ctx)
        await self.stop_all_metrics()
