"""Streaming flow with per-request caches (flow/cache.py) against the recomputing path, tiny CosyVoice2.

The recomputing path runs the flow over prompt + every token so far at each hop and
keeps the new frames; the cached path runs the estimator over the new frames only,
with the earlier frames' convolution context and attention keys/values from its cache.
In fp32 the two differ only by summation order (attention over a longer key list in
one call vs cached + new, the same convolutions): measured max |diff| ~1e-6 on mel
values of magnitude ~1-10; the bound 1e-4 (relative to the mel's scale) leaves room
for other CPUs' kernels while any wrong context (a missing conv frame, a shifted noise
index, a chunk off by one) moves frames by O(1).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.base import SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.flow import cache as flow_cache
from app.engines.cosyvoice.load import load_model_dir
from tests.support import configs
from tests.support.flow_streams import (
    EXACT,
    STREAM_TEXT,
    inputs,
    stream_pcm,
    streamed_mel,
)


@pytest.fixture(scope="module")
def flow(tiny_models):
    lm = load_model_dir(tiny_models(2), dtype="fp32")
    assert flow_cache.supports_flow_cache(lm.model.flow)
    flow_cache.install(lm.model.flow)
    return lm.model.flow


def test_cached_streaming_equals_recomputing_and_costs_its_own_frames(flow):
    x = inputs()
    ref, recomputed = streamed_mel(flow, x)
    stream = flow_cache.FlowStream()
    got, _ = streamed_mel(flow, x, stream)
    assert got.shape == ref.shape == (1, 80, 2 * 86)
    scale = float(ref.abs().max())
    assert float((got - ref).abs().max()) <= EXACT * scale
    total = 2 * (50 + 86)
    assert stream.frames_computed == total  # every frame once, prompt included
    assert recomputed >= 2 * total  # the recomputing path ran the prefix again at every hop
    assert stream.nbytes() > 0


def test_a_bounded_window_stays_close_and_caps_memory(flow):
    x = inputs(seed=1)
    ref, _ = streamed_mel(flow, x)
    exact, windowed = flow_cache.FlowStream(), flow_cache.FlowStream(window_frames=100)
    streamed_mel(flow, x, exact)
    got, _ = streamed_mel(flow, x, windowed)
    rel = float((got - ref).norm() / ref.norm())
    assert 0 < rel < 0.5, rel  # inexact, but the same speech shape (measured ~0.1 on random weights)
    assert windowed.nbytes() < exact.nbytes()
    k, _ = next(iter(windowed.kv.values()))
    assert k.shape[2] == 100


def test_uncached_calls_are_untouched(flow):
    x = inputs(seed=2)
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)
    with torch.inference_mode():
        a, _ = flow.inference(token=x["token"], token_len=n(x["token"]), prompt_token=x["prompt"],
                              prompt_token_len=n(x["prompt"]), prompt_feat=x["feat"], prompt_feat_len=n(x["feat"]),
                              embedding=x["emb"], streaming=False, finalize=True)
        b, _ = flow.inference.__wrapped__(token=x["token"], token_len=n(x["token"]), prompt_token=x["prompt"],
                                          prompt_token_len=n(x["prompt"]), prompt_feat=x["feat"],
                                          prompt_feat_len=n(x["feat"]), embedding=x["emb"], streaming=False,
                                          finalize=True)
    assert torch.equal(a, b)


@pytest.fixture(scope="module")
def engines(tiny_models):
    out = {}
    for cached in (False, True):
        eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=True,
                                              llm_greedy=True, flow_cache=cached))
        eng.load()
        out[cached] = eng
    assert out[True].runner.flow_cache and not out[False].runner.flow_cache
    yield out
    for eng in out.values():
        eng.close()


def speak(eng, cancel_after: int | None = None):
    req = SynthesisRequest(text=STREAM_TEXT, mode="sft", speaker=eng.voices()[0], stream=True, seed=5)
    return stream_pcm(eng, req, cancel_after)


def test_engine_streams_the_same_audio_with_the_cache(engines):
    plain, cached = speak(engines[False]), speak(engines[True])
    assert len(plain) == len(cached) >= 3
    for a, b in zip(plain[:-1], cached[:-1]):  # streamed hops: the same audio (int16, +-1 for rounding)
        assert a.shape == b.shape and int(np.abs(a - b).max()) <= 1
    # the last chunk: chunk-masked here, full attention in the recomputing path's final call
    assert plain[-1].shape == cached[-1].shape
    model = engines[True].loaded.model
    assert not model.hift_cache_dict  # per-request HiFT state is gone after the stream


def test_cancelling_a_cached_stream_leaves_nothing_behind(engines):
    eng = engines[True]
    chunks = speak(eng, cancel_after=1)
    assert len(chunks) == 1
    assert not eng.loaded.model.hift_cache_dict
    again = speak(eng)  # the next request starts from a clean state: same audio as before
    assert len(again) >= 3
