"""The server-wide flow cache budget (engine.flow_cache_budget_mb), tiny CosyVoice2 on the CPU.

A stream holds what the budget gives it; one that does not fit (at its first hop or later)
drops its cache and recomputes its prefix, CosyVoice's own way: the same frames to float
rounding. Every stream gives its bytes back when it ends; refusals are counted.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.base import SynthesisRequest  # noqa: E402
from app.engines.cosyvoice.engine import CosyVoiceEngine  # noqa: E402
from app.engines.cosyvoice.flow import cache as flow_cache  # noqa: E402
from app.engines.cosyvoice.flow.budget import FlowCacheBudget, bytes_per_frame  # noqa: E402
from app.engines.cosyvoice.load import load_model_dir  # noqa: E402
from tests.support import configs  # noqa: E402
from tests.support.flow_streams import (  # noqa: E402
    EXACT,
    STREAM_TEXT,
    inputs,
    streamed_mel,
)


@pytest.fixture(scope="module")
def flow(tiny_models):
    lm = load_model_dir(tiny_models(2), dtype="fp32")
    flow_cache.install(lm.model.flow)
    return lm.model.flow


def budget(flow, max_bytes: int, calls: list | None = None) -> FlowCacheBudget:
    return FlowCacheBudget(max_bytes, bytes_per_frame(flow), on_recompute=(lambda: calls.append(1)) if calls is not None
                           else None)


def test_bytes_per_frame_is_what_a_cached_frame_costs(flow):
    x = inputs(seed=3)
    stream = flow_cache.FlowStream()
    sizes = []
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)  # noqa: E731
    with torch.inference_mode(), flow_cache.bound_stream(stream):
        for end in (53, 78):  # two hops: 50 prompt tokens + 28 / + 53 tokens (25 more: 50 more frames)
            tok = x["token"][:, :end]
            flow.inference(token=tok, token_len=n(tok), prompt_token=x["prompt"], prompt_token_len=n(x["prompt"]),
                           prompt_feat=x["feat"], prompt_feat_len=n(x["feat"]), embedding=x["emb"], streaming=True,
                           finalize=False)
            kv = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in stream.kv.values())
            sizes.append((stream.frames_done, kv))
    (f0, b0), (f1, b1) = sizes
    assert f1 - f0 == 50 and (b1 - b0) == (f1 - f0) * bytes_per_frame(flow)


def test_a_stream_within_the_budget_is_cached_and_gives_its_bytes_back(flow):
    x = inputs(seed=4)
    ref, _ = streamed_mel(flow, x)
    b = budget(flow, 1 << 40)
    stream = flow_cache.FlowStream(budget=b)
    got, _ = streamed_mel(flow, x, stream)
    assert float((got - ref).abs().max()) <= EXACT * float(ref.abs().max())
    assert stream.frames_computed == 2 * (50 + 86) and not stream.recompute
    assert b.used == stream.nbytes() > 0 and b.stats()["streams"] == 1
    stream.close()
    assert b.used == 0 and b.stats() == {"bytes": 0, "max_bytes": 1 << 40, "streams": 0, "recomputed": 0}


def test_a_stream_that_does_not_fit_recomputes_exactly_as_without_the_cache(flow):
    x = inputs(seed=5)
    ref, recomputed_frames = streamed_mel(flow, x)
    calls: list = []
    b = budget(flow, 1, calls)
    stream = flow_cache.FlowStream(budget=b)
    got, _ = streamed_mel(flow, x, stream)
    assert torch.equal(got, ref)  # CosyVoice's own path, untouched
    assert stream.recompute and stream.frames_computed == 0 and stream.nbytes() == 0
    assert b.used == 0 and b.recomputed == 1 and calls == [1]


def test_a_stream_refused_mid_way_switches_to_recomputing_and_stays_exact(flow):
    x = inputs(seed=6)
    ref, _ = streamed_mel(flow, x)
    per_frame = bytes_per_frame(flow)
    b = budget(flow, 2 * (50 + 56) * per_frame + (1 << 20))  # room for the first hop (56 tokens), not the next
    stream = flow_cache.FlowStream(budget=b)
    got, _ = streamed_mel(flow, x, stream)
    assert stream.recompute and 0 < stream.frames_computed < 2 * (50 + 86)
    assert float((got - ref).abs().max()) <= EXACT * float(ref.abs().max())
    assert b.used == 0 and b.recomputed == 1


def test_the_budget_is_shared_a_second_stream_waits_for_room_by_recomputing(flow):
    x = inputs(seed=7)
    b = budget(flow, 2 * (50 + 86 + 25) * bytes_per_frame(flow))  # one whole stream fits, not two
    first, second = flow_cache.FlowStream(budget=b), flow_cache.FlowStream(budget=b)
    streamed_mel(flow, x, first)
    assert not first.recompute and b.used > 0
    streamed_mel(flow, x, second)  # while the first still holds its cache
    assert second.recompute and b.recomputed == 1
    first.close()
    third = flow_cache.FlowStream(budget=b)
    streamed_mel(flow, x, third)
    assert not third.recompute
    third.close()
    assert b.used == 0


class Observer:
    def __init__(self) -> None:
        self.recomputed = 0

    def on_step(self, batch_size: int, seconds: float) -> None:
        pass

    def on_tokens(self, n: int) -> None:
        pass

    def on_flow_cache_recompute(self) -> None:
        self.recomputed += 1


def test_an_engine_with_no_room_streams_the_recomputing_paths_audio_and_counts_it(tiny_models):
    obs = Observer()
    engines = {}
    for name, cfg in (("plain", {}), ("full", {"flow_cache": True, "flow_cache_budget_mb": 0})):
        engines[name] = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=True,
                                                        llm_greedy=True, **cfg), llm_observer=obs)
        engines[name].load()
    try:
        out = {}
        for name, eng in engines.items():
            torch.manual_seed(1234)  # HiFT's excitation noise
            req = SynthesisRequest(text=STREAM_TEXT, mode="sft", speaker=eng.voices()[0], stream=True, seed=5)
            out[name] = [c.pcm for c in eng.synthesize(req, threading.Event())]
        assert len(out["plain"]) == len(out["full"]) >= 3
        for a, b in zip(out["plain"], out["full"]):
            assert np.array_equal(a, b)
        assert obs.recomputed == 1
        assert engines["full"].runner.flow_budget.stats()["bytes"] == 0
    finally:
        for eng in engines.values():
            eng.close()
