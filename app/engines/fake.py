"""A deterministic engine for HTTP-layer and pool tests: no torch, no model.

It speaks a sine tone whose length follows the text, in a fixed number of
chunks, and can be told to be slow, to wait on a gate, or to fail at a given
point, so tests can drive the serving layer into every state on purpose.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from app.engines.base import (
    MODES,
    AudioChunk,
    EngineFailure,
    EngineInfo,
    InvalidInput,
    PromptAudio,
    SynthesisRequest,
    check_mode_inputs,
)
from app.text.segments import segment_texts


@dataclass
class FakeBehaviour:
    """Knobs shared by every FakeEngine built from one factory (tests mutate them)."""

    sample_rate: int = 24000
    chunks: int = 3
    chunk_s: float = 0.2  # audio seconds per chunk
    first_chunk_delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    load_delay_s: float = 0.0
    gate: threading.Event | None = None  # when set to an Event, synthesis waits for it first
    fail_on_load: bool = False
    fail_at_chunk: int | None = None  # raise EngineFailure before yielding this chunk index
    unhealthy: bool = False
    fail_on_voice: bool = False
    voices_computed: int = 0
    speakers: tuple[str, ...] = ("fake_female", "fake_male")
    modes: tuple[str, ...] = MODES
    first_chunk_tokens: tuple[int, int] | None = (5, 100)  # the first-chunk range it reports (None: not settable)
    first_chunks: list[int | None] = field(default_factory=list)  # each request's first_chunk_tokens, as received
    started: list[str] = field(default_factory=list)  # request ids that began synthesizing
    cancelled: list[str] = field(default_factory=list)  # request ids that saw their cancel flag
    finished: list[str] = field(default_factory=list)
    spoken: list[str] = field(default_factory=list)  # streamed text (WebSocket): each sentence as spoken
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class FakeVoice:
    family: str
    prompt_text: str
    level: float


class FakeEngine:
    def __init__(self, behaviour: FakeBehaviour | None = None, name: str = "fake") -> None:
        self.b = behaviour or FakeBehaviour()
        self.name = name
        self.sample_rate = self.b.sample_rate
        self.loaded = False
        self.warmed = False
        self.closed = False
        self.threads: set[str] = set()

    def info(self) -> EngineInfo:
        return EngineInfo(name=self.name, family="fake", sample_rate=self.sample_rate, modes=tuple(self.b.modes),
                          voice_family="fake-1", first_chunk_tokens=self.b.first_chunk_tokens)

    # -- voice library support: a "voice" is the prompt's RMS level and transcript -------------
    def compute_voice(self, prompt_text: str, audio: PromptAudio) -> FakeVoice:
        if self.b.fail_on_voice:
            raise EngineFailure("fake engine told to fail computing a voice")
        with self.b.lock:
            self.b.voices_computed += 1
        rms = float(np.sqrt(np.mean(np.square(audio.samples)))) if len(audio.samples) else 0.0
        return FakeVoice(family="fake-1", prompt_text=prompt_text, level=rms)

    def export_voice(self, voice: FakeVoice) -> bytes:
        return json.dumps({"family": voice.family, "prompt_text": voice.prompt_text, "level": voice.level}).encode()

    def import_voice(self, data: bytes) -> FakeVoice:
        d = json.loads(data.decode())
        return FakeVoice(family=d["family"], prompt_text=d["prompt_text"], level=float(d["level"]))

    def load(self) -> None:
        self.threads.add(threading.current_thread().name)
        if self.b.load_delay_s:
            time.sleep(self.b.load_delay_s)
        if self.b.fail_on_load:
            raise EngineFailure("fake engine told to fail on load")
        self.loaded = True

    def warmup(self) -> None:
        self.threads.add(threading.current_thread().name)
        self.warmed = True

    def voices(self) -> Sequence[str]:
        return list(self.b.speakers)

    def health_check(self) -> None:
        if self.b.unhealthy:
            raise EngineFailure("fake engine told to be unhealthy")

    def close(self) -> None:
        self.closed = True

    def _wait(self, seconds: float, cancel: threading.Event) -> bool:
        """Sleep up to ``seconds``; True if cancelled meanwhile."""
        return cancel.wait(seconds) if seconds > 0 else cancel.is_set()

    def synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        check_mode_inputs(req, self.b.modes, self.b.speakers)
        bounds, first = self.b.first_chunk_tokens, req.first_chunk_tokens
        if first is not None and (bounds is None or not bounds[0] <= first <= bounds[1]):
            raise InvalidInput(f"first_chunk_tokens outside this engine's range {bounds}")
        self.threads.add(threading.current_thread().name)
        with self.b.lock:
            self.b.started.append(req.request_id)
            self.b.first_chunks.append(req.first_chunk_tokens)
        try:
            if self.b.gate is not None:
                while not self.b.gate.wait(0.01):
                    if cancel.is_set():
                        self._mark_cancelled(req)
                        return
            if req.text_stream is None:
                if not (yield from self._tone(req, cancel)):
                    return
            else:  # sentence by sentence, as each one completes
                spoken = False
                for sentence in segment_texts(req.text_stream, cancel, min_chars=0):
                    with self.b.lock:
                        self.b.spoken.append(sentence)
                    spoken = True
                    if not (yield from self._tone(req, cancel)):
                        return
                if cancel.is_set():
                    self._mark_cancelled(req)
                    return
                if not spoken:
                    raise InvalidInput("the utterance has no text to speak")
            with self.b.lock:
                self.b.finished.append(req.request_id)
        except GeneratorExit:
            self._mark_cancelled(req)
            raise

    def _tone(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        """``chunks`` chunks of a 220 Hz tone; returns False if cancelled meanwhile."""
        n = max(1, self.b.chunks)
        per_chunk = int(self.b.chunk_s * self.sample_rate / max(req.speed, 1e-3))
        first = per_chunk if req.first_chunk_tokens is None else req.first_chunk_tokens * self.sample_rate // 25
        for i in range(n):
            delay = self.b.first_chunk_delay_s if i == 0 else self.b.chunk_delay_s
            if self._wait(delay, cancel):
                self._mark_cancelled(req)
                return False
            if self.b.fail_at_chunk is not None and i == self.b.fail_at_chunk:
                raise EngineFailure(f"fake engine told to fail at chunk {i}")
            size = first if i == 0 and req.stream else per_chunk  # 25 speech tokens a second, like CosyVoice2/3
            t = (np.arange(size) + i * per_chunk) / self.sample_rate
            tone = 0.3 * np.sin(2 * np.pi * 220.0 * t)
            yield AudioChunk(pcm=(tone * 32767).astype(np.int16), sample_rate=self.sample_rate)
        return True

    def _mark_cancelled(self, req: SynthesisRequest) -> None:
        with self.b.lock:
            self.b.cancelled.append(req.request_id)
