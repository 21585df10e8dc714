"""Encoding where the PCM is produced: engine chunks -> encoded bytes, in the slot's thread.

``pieces()`` wraps the engine generator inside the slot thread, so resampling,
libav (mp3/opus/aac/flac) and whole-file encoding never run on the event loop:
the loop only moves bytes. It yields one :class:`Piece` per engine chunk (its
bytes may be empty, e.g. whole-file WAV, but it carries the chunk's audio
seconds, so time to first audio and backpressure stay honest) and a final piece
from ``finish()``. The encoder is built at the first chunk, in the thread: a
codec that fails to open is an error of the job (the job is closed and its slot
freed like any engine error), never a half-built response.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from app.audio.encode import Encoder, make_encoder
from app.audio.formats import AudioFormat, resolve_format
from app.engines.base import AudioChunk
from app.engines.timings import StageTimings

EncoderFactory = Callable[..., Encoder]


@dataclass(frozen=True)
class Piece:
    """Encoded bytes, and the seconds of source audio they carry."""

    data: bytes
    duration_s: float = 0.0
    final: bool = False

    def __len__(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class OutputSpec:
    """What to send: format, streamed or whole, and the rate the client will get."""

    format: AudioFormat
    stream: bool
    sample_rate: int  # the output rate (after resampling and the format's own rules)
    requested_rate: int | None = None

    @property
    def content_type(self) -> str:
        return self.format.content_type

    @classmethod
    def build(cls, fmt: str, stream: bool, native_rate: int, out_rate: int | None = None) -> OutputSpec:
        f = resolve_format(fmt)
        return cls(f, stream, f.output_rate(int(out_rate) if out_rate else int(native_rate)), out_rate)


def pieces(chunks: Iterable[AudioChunk], cancel: threading.Event, out: OutputSpec, native_rate: int,
           make: EncoderFactory = make_encoder, timings: StageTimings | None = None) -> Iterator[Piece]:
    """In the slot thread: encode ``chunks`` as ``out`` says; closes the engine generator too.

    Encoding seconds (encoder setup, feed, finish) are added to ``timings`` as ``encode``.
    """
    timings = timings if timings is not None else StageTimings()
    encoder: Encoder | None = None
    with closing(_closable(chunks)):
        try:
            for chunk in chunks:
                if cancel.is_set():
                    return
                with timings.measure("encode"):
                    if encoder is None:
                        encoder = make(out.format, chunk.sample_rate, stream=out.stream, out_rate=out.requested_rate)
                    data = encoder.feed(chunk.pcm)
                yield Piece(data, chunk.duration_s)
            if cancel.is_set():
                return
            with timings.measure("encode"):
                if encoder is None:
                    encoder = make(out.format, native_rate, stream=out.stream, out_rate=out.requested_rate)
                data = encoder.finish()
            yield Piece(data, 0.0, final=True)
        finally:
            if encoder is not None:
                encoder.close()


class _NoClose:
    def __init__(self, it: Any) -> None:
        self.it = it

    def close(self) -> None:
        pass


def _closable(it: Any) -> Any:
    return it if hasattr(it, "close") else _NoClose(it)
