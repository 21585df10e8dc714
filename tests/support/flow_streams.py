"""Streaming the flow hop by hop and an engine's streamed PCM: the flow cache tests' shared runs.

Imports torch: import it after ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from app.engines.base import SynthesisRequest
from app.engines.cosyvoice.flow import cache as flow_cache

EXACT = 1e-4  # streamed (cached) against recomputed mel: largest difference / the mel's scale, fp32


def inputs(n_tokens: int = 86, n_prompt: int = 50, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return {"token": torch.randint(0, 6561, (1, n_tokens), generator=gen, dtype=torch.int32),
            "prompt": torch.randint(0, 6561, (1, n_prompt), generator=gen, dtype=torch.int32),
            "feat": torch.randn(1, 2 * n_prompt, 80, generator=gen),
            "emb": torch.randn(1, 192, generator=gen)}


def hops(n_tokens: int, n_prompt: int, hop: int = 25, look: int = 3):
    """(end token, offset, finalize) of each call, as token2wav/hops.py schedules them (fixed hop)."""
    pad = -(-n_prompt // hop) * hop - n_prompt
    offset, calls = 0, []
    while True:
        this = hop + pad if offset == 0 else hop
        if offset + this + look > n_tokens:
            break
        calls.append((offset + this + look, offset, False))
        offset += this
    calls.append((n_tokens, offset, True))
    return calls


def streamed_mel(flow, x, stream=None):
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)
    parts, frames = [], 0
    with torch.inference_mode(), flow_cache.bound_stream(stream):
        for end, offset, final in hops(x["token"].shape[1], x["prompt"].shape[1]):
            tok = x["token"][:, :end]
            mel, _ = flow.inference(token=tok, token_len=n(tok), prompt_token=x["prompt"],
                                    prompt_token_len=n(x["prompt"]), prompt_feat=x["feat"],
                                    prompt_feat_len=n(x["feat"]), embedding=x["emb"], streaming=True,
                                    finalize=final)
            parts.append(mel[:, :, offset * 2:])
            frames += 2 * (x["prompt"].shape[1] + (end if final else end - 3))
    return torch.cat(parts, dim=2), frames


STREAM_TEXT = ("The train to the city leaves at seven every single morning, and the people who "
               "ride it read, sleep or stare at the fields going by.")


def stream_pcm(eng, req: SynthesisRequest, cancel_after: int | None = None) -> list:
    """The streamed chunks' PCM (int32), cancelling after ``cancel_after`` chunks if given."""
    torch.manual_seed(1234)  # HiFT's excitation noise (the LLM is greedy, the flow's noise fixed)
    cancel = threading.Event()
    chunks = []
    for chunk in eng.synthesize(req, cancel):
        chunks.append(chunk.pcm.astype(np.int32))
        if cancel_after is not None and len(chunks) >= cancel_after:
            cancel.set()
    return chunks
