"""Issue 51's reproducibility check: a seeded request's PCM bytes, repeated alone and beside others.

Between runs the global generator is moved and, for the runs beside others, four unseeded requests
(two streamed) run in their own threads at the same time, so any draw still taken from the global
generator, or from another request's generator, would change the bytes. Used by the v2 test
(tests/integration/engines/cosyvoice/token2wav/test_seeded_noise.py) and, for CosyVoice3, by the
upstream checkout's test (tests/integration/upstream/test_upstream_checkout.py).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from app.engines.base import PromptAudio, SynthesisRequest

TEXT = "A seeded request gives the same bytes, alone or beside others."
OTHERS = ["Another request runs beside it.", "And a third one, a little longer than the second.",
          "A fourth, streamed.", "The fifth of them."]
REPEATS = 10  # the goal: 10 alone and 10 beside others


def request(eng, prompt_audio: PromptAudio, text: str, **kw) -> SynthesisRequest:
    """A preset speaker where the model has one, else a cross-lingual clone of ``prompt_audio``."""
    speakers = list(eng.voices())
    if speakers:
        return SynthesisRequest(text=text, speaker=speakers[0], **kw)
    return SynthesisRequest(text=text, mode="cross_lingual", prompt_audio=prompt_audio, **kw)


def pcm(eng, req: SynthesisRequest, global_seed: int) -> bytes:
    torch.manual_seed(global_seed)  # another request's draws, or a restart, moved the global generator
    return np.concatenate([c.pcm for c in eng.synthesize(req, threading.Event())]).tobytes()


def beside_others(eng, prompt_audio: PromptAudio, req: SynthesisRequest, global_seed: int = 7) -> bytes:
    """``req``'s bytes while four unseeded requests (two streamed) run in their own threads."""
    go = threading.Barrier(len(OTHERS) + 1)
    errors: list[BaseException] = []

    def other(i: int) -> None:
        try:
            go.wait()
            pcm(eng, request(eng, prompt_audio, OTHERS[i], stream=i % 2 == 1), global_seed=100 * global_seed + i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=other, args=(i,)) for i in range(len(OTHERS))]
    for t in threads:
        t.start()
    go.wait()
    out = pcm(eng, req, global_seed=global_seed)
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def check_repeats(eng, prompt_audio: PromptAudio, *, stream: bool, repeats: int = REPEATS) -> dict:
    """Assert ``repeats`` runs alone and ``repeats`` beside others give the first run's bytes, and
    another seed other bytes; returns what it saw (for a script to print)."""
    seeded = request(eng, prompt_audio, TEXT, seed=1234, stream=stream)
    first = pcm(eng, seeded, global_seed=1)
    assert len(first) > 2000
    alone = [pcm(eng, seeded, global_seed=2 + i) == first for i in range(repeats)]
    beside = [beside_others(eng, prompt_audio, seeded, global_seed=7 + i) == first for i in range(repeats)]
    assert all(alone), f"alone: {alone.count(False)} of {repeats} runs differ"
    assert all(beside), f"beside others: {beside.count(False)} of {repeats} runs differ"
    other = pcm(eng, request(eng, prompt_audio, TEXT, seed=1235, stream=stream), global_seed=1)
    assert other != first
    return {"stream": stream, "bytes": len(first), "alone": repeats, "beside": repeats}
