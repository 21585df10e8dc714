"""The flow cache on ONNX Runtime (flow/onnx_stream.py): a graph that takes and returns a stream's caches.

Against the hooked torch estimator (the same function: its trace) and the recomputing path, tiny
CosyVoice2. fp32 caches: float reassociation only (measured ~5e-7 of the mel's scale here, ~1e-6
at full size), bound 1e-4. fp16 caches round every stored key and value to 11 bits: measured
6e-5 of the mel's scale here and 4.6e-5 at full size against the recomputing path; the bound,
5e-4, is ~8x that, while a wrong cache (a missing step, a shifted frame, another layer's keys)
moves the mel by whole units.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from app.engines.base import SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.flow import cache as flow_cache
from app.engines.cosyvoice.flow import onnx_stream
from app.engines.cosyvoice.flow.onnx import OnnxUnavailable, weights_key
from app.engines.cosyvoice.load import load_model_dir
from tests.support import configs
from tests.support.flow_streams import (
    EXACT,
    STREAM_TEXT,
    inputs,
    stream_pcm,
    streamed_mel,
)

FP16_BOUND = 5e-4  # of the mel's scale, fp16 caches against the recomputing path
DTYPES = {"fp32": None, "fp16": torch.float16}


@pytest.fixture(scope="module")
def flow(tiny_models):
    lm = load_model_dir(tiny_models(2), dtype="fp32")
    flow_cache.install(lm.model.flow)
    return lm.model.flow


@pytest.fixture(scope="module")
def graphs(flow, tmp_path_factory):
    cache = tmp_path_factory.mktemp("onnx-stream")
    est = flow.decoder.estimator
    return cache, {s: onnx_stream.load_stream_estimator(est, cache_dir=cache, storage=s) for s in DTYPES}


def _stream(storage, runtime=None, **kw):
    return flow_cache.FlowStream(kv_dtype=DTYPES[storage], runtime=runtime, **kw)


@pytest.mark.parametrize("storage", list(DTYPES))
def test_the_graph_streams_what_the_torch_hooks_and_the_recomputing_path_do(flow, graphs, storage):
    x = inputs()
    ref, _ = streamed_mel(flow, x)
    torch_stream, ort_stream = _stream(storage), _stream(storage, graphs[1][storage])
    hooked, _ = streamed_mel(flow, x, torch_stream)
    got, _ = streamed_mel(flow, x, ort_stream)
    scale = float(ref.abs().max())
    assert got.shape == ref.shape == (1, 80, 2 * 86)
    bound = EXACT if storage == "fp32" else FP16_BOUND
    assert float((got - ref).abs().max()) <= bound * scale
    assert float((got - hooked).abs().max()) <= bound * scale
    assert ort_stream.frames_computed == torch_stream.frames_computed == 2 * (50 + 86)
    held = {k: v for k, v in ort_stream.kv.items()}
    assert all(k.dtype == (DTYPES[storage] or torch.float32) for k, _ in held.values())
    assert ort_stream.nbytes() == torch_stream.nbytes() > 0


def test_fp16_caches_hold_about_half_the_bytes(flow, graphs):
    x = inputs(seed=2)
    sizes = {}
    for storage in DTYPES:
        stream = _stream(storage, graphs[1][storage])
        streamed_mel(flow, x, stream)
        sizes[storage] = stream.nbytes()
    assert 0.45 * sizes["fp32"] < sizes["fp16"] < 0.55 * sizes["fp32"]


def test_a_window_is_applied_to_the_graphs_caches_as_to_the_hooks(flow, graphs):
    x = inputs(seed=3)
    hooked, _ = streamed_mel(flow, x, _stream("fp32", window_frames=100))
    stream = _stream("fp32", graphs[1]["fp32"], window_frames=100)
    got, _ = streamed_mel(flow, x, stream)
    assert float((got - hooked).abs().max()) <= EXACT * float(hooked.abs().max())
    assert max(k.shape[2] for k, _ in stream.kv.values()) == 100


def test_the_graph_is_kept_and_found_again(flow, graphs, monkeypatch):
    cache, loaded = graphs
    assert {g.source for g in loaded.values()} == {"exported"}
    folder = cache / weights_key(flow.decoder.estimator)[:32]
    assert sorted(p.name for p in folder.iterdir()) == ["estimator-stream-fp16.onnx", "estimator-stream-fp32.onnx"]
    monkeypatch.setattr(onnx_stream, "export", lambda *a: pytest.fail("exported again"))
    again = onnx_stream.load_stream_estimator(flow.decoder.estimator, cache_dir=cache, storage="fp16")
    assert again.source == "cache"


def test_an_estimator_without_the_hooks_is_refused(tiny_models, tmp_path):
    est = load_model_dir(tiny_models(2), dtype="fp32").model.flow.decoder.estimator
    with pytest.raises(OnnxUnavailable, match="not hooked"):
        onnx_stream.load_stream_estimator(est, cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


class Usage:
    def __init__(self):
        self.seen = []

    def on_step(self, batch_size, seconds):
        pass

    def on_tokens(self, n):
        pass

    def on_flow_cache_usage(self, held, budget, streams):
        self.seen.append((held, budget, streams))


@pytest.fixture(scope="module")
def server_engines(tiny_models, tmp_path_factory):
    """The server's engine defaults (ONNX Runtime flow, flow cache auto, fp16 caches, sized budget), and the same
    with the flow cache off (the recomputing streams of the same runtime)."""
    cache = tmp_path_factory.mktemp("onnx-engines")
    out = {}
    for name, setting in (("default", "auto"), ("off", False)):
        usage = Usage()
        eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=True,
                                              llm_greedy=True, flow_runtime="auto", flow_cache=setting,
                                              flow_cache_budget_mb=None, flow_cache_precision="fp16",
                                              onnx_cache_dir=str(cache)), llm_observer=usage)
        eng.load()
        out[name] = (eng, usage)
    yield out
    for eng, _ in out.values():
        eng.close()


def test_the_defaults_stream_with_the_cache_on_onnx_runtime_within_a_sized_budget(server_engines):
    eng, usage = server_engines["default"]
    runner = eng.runner
    assert runner.flow_cache and isinstance(runner.flow_runtime, onnx_stream.StreamEstimator)
    assert runner.flow_runtime.storage == "fp16"
    assert runner.flow_budget is not None and runner.flow_budget.max_bytes > 64 * 2**20  # a share of free memory
    assert usage.seen[0] == (0, runner.flow_budget.max_bytes, 0)  # reported before any stream
    before = runner.flow_runtime.frames
    req = SynthesisRequest(text=STREAM_TEXT, mode="sft", speaker=eng.voices()[0], stream=True, seed=5)
    chunks = stream_pcm(eng, req)
    assert len(chunks) >= 3 and runner.flow_runtime.frames > before  # the graph ran the hops
    assert max(held for held, _, _ in usage.seen) > 0 and usage.seen[-1][0] == usage.seen[-1][2] == 0
    off, _ = server_engines["off"]
    assert not off.runner.flow_cache and off.runner.flow_runtime is None
    plain = stream_pcm(off, SynthesisRequest(text=STREAM_TEXT, mode="sft", speaker=off.voices()[0], stream=True,
                                             seed=5))
    assert [c.shape for c in plain] == [c.shape for c in chunks]
    a, b = np.concatenate(plain[:-1]).astype(float), np.concatenate(chunks[:-1]).astype(float)
    assert np.corrcoef(a, b)[0, 1] > 0.999  # the streamed hops: the same audio within fp16's rounding


def test_the_stream_graphs_plan_no_memory_pattern_per_shape(graphs):
    # each hop's caches grow: a pattern per shape grew the arena without bound (docs/memory.md)
    for runner in graphs[1].values():
        assert runner.session.get_session_options().enable_mem_pattern is False
