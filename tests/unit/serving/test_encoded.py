"""Encoding in the slot thread: engine chunks -> encoded pieces that keep their audio seconds."""

from __future__ import annotations

import threading

import numpy as np

from app.engines.base import AudioChunk
from app.serving.encoded import OutputSpec, pieces


def test_encoded_pieces_keep_the_audio_seconds():
    chunks = [AudioChunk(np.zeros(2400, np.int16), 24000) for _ in range(3)]
    out = list(pieces(iter(chunks), threading.Event(), OutputSpec.build("wav", False, 24000), 24000))
    assert [p.duration_s for p in out] == [0.1, 0.1, 0.1, 0.0] and out[-1].final
    assert [len(p) for p in out[:3]] == [0, 0, 0] and out[-1].data[:4] == b"RIFF"
    cancel = threading.Event()
    cancel.set()
    assert list(pieces(iter(chunks), cancel, OutputSpec.build("wav", True, 24000), 24000)) == []
