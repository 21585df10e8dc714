"""Flow calls of every kind token2wav makes, CosyVoice's own flow as their reference, and whole-engine audio
compared across paths (HiFT's noise seeded per call): the batched-flow tests' shared parts (in-process,
and in a subprocess on an upstream checkout).

Imports torch: import it after ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import torch

from app.engines.base import PromptAudio, SynthesisRequest
from app.engines.cosyvoice.flow.batch import FlowItem
from tests.support.engine_requests import mixed_requests
from tests.support.sounds import speechlike

EXACT = 1e-4


def item(n_tokens: int, n_prompt: int, *, streaming: bool, finalize: bool, seed: int = 0) -> FlowItem:
    gen = torch.Generator().manual_seed(seed)
    return FlowItem(token=torch.randint(0, 6561, (1, n_tokens), generator=gen, dtype=torch.int32),
                    prompt_token=torch.randint(0, 6561, (1, n_prompt), generator=gen, dtype=torch.int32),
                    prompt_feat=torch.randn(1, 2 * n_prompt, 80, generator=gen),
                    embedding=torch.randn(1, 192, generator=gen), streaming=streaming, finalize=finalize)


def reference(flow, it: FlowItem):
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)
    with torch.inference_mode():
        mel, _ = flow.inference(token=it.token, token_len=n(it.token), prompt_token=it.prompt_token,
                                prompt_token_len=n(it.prompt_token), prompt_feat=it.prompt_feat,
                                prompt_feat_len=n(it.prompt_feat), embedding=it.embedding,
                                streaming=it.streaming, finalize=it.finalize)
    return mel


def assert_exact(got, want) -> None:
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= EXACT * float(want.abs().max())


MIX = [  # (tokens, prompt tokens, streaming, finalize): every kind of call token2wav makes
    (28, 50, True, False),  # a first streamed hop after a whole-chunk prompt
    (53, 30, True, False),  # a later hop (look-ahead context), another prompt length
    (90, 0, False, True),  # a non-streaming request without prompt (sft)
    (40, 75, False, True),  # the last call of a stream (full attention)
    (20, 10, True, False),  # the shortest row
    (120, 37, True, True),  # chunk-masked and final (the flow cache's last call)
]


@contextlib.contextmanager
def deterministic_hift(*engines):
    """Seed every HiFT call from its mel length, one call at a time (its noise then depends on the mel only)."""
    lock = threading.Lock()
    saved = []
    for eng in engines:
        hift = eng.loaded.model.hift
        inner = hift.inference

        def inference(*args, _inner=inner, **kw):
            feat = kw.get("speech_feat", args[0] if args else None)
            with lock:
                torch.manual_seed(int(feat.shape[2]))
                return _inner(*args, **kw)

        hift.inference = inference
        saved.append((hift, inner))
    try:
        yield
    finally:
        for hift, inner in saved:
            hift.inference = inner


def pcm(eng, req: SynthesisRequest, cancel: threading.Event | None = None) -> list[np.ndarray]:
    return [c.pcm.astype(np.int32) for c in eng.synthesize(req, cancel or threading.Event())]


def assert_same_audio(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert [len(c) for c in got] == [len(c) for c in want]
    for a, b in zip(got, want):
        assert int(np.abs(a - b).max()) <= 1  # int16, +-1 for rounding


def every_mode(eng) -> list[SynthesisRequest]:
    reqs = mixed_requests(eng)
    vc = SynthesisRequest(mode="vc", prompt_audio=PromptAudio(speechlike(3.0), 16000),
                          source_audio=PromptAudio(speechlike(2.0, seed=5), 16000))
    return [reqs[0], reqs[2], reqs[4], reqs[5], vc]  # sft, zero_shot, cross_lingual, instruct2, vc
