"""The flow estimator on ONNX Runtime (``engine.flow_runtime``) against torch, and its export cache.

Equality: ONNX Runtime computes the same graph in fp32 with other kernels and fusions, so the
mel differs from torch's by float reassociation only (measured ~1e-6 of the mel's scale at
tiny and full size); the bound is 1e-4 of the mel's scale, the issue's, ~100x that. A wrong
mask (streaming vs not), a wrong input order or stale weights move the mel by whole units.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import warnings

import numpy as np
import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from app.engines.base import EngineFailure, SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.flow import onnx as flow_onnx
from app.engines.cosyvoice.flow.onnx import (
    MODEL_DIR_FILE,
    load_onnx_estimator,
    weights_key,
)
from app.engines.cosyvoice.flow.solver import onnx_of
from app.engines.cosyvoice.load import load_model_dir
from tests.support import configs

MEL_BOUND = 1e-4  # of the mel's largest magnitude


def flow_mel(model, tokens, prompt, feat, emb, streaming):
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)
    with torch.inference_mode():
        mel, _ = model.flow.inference(token=tokens, token_len=n(tokens), prompt_token=prompt,
                                      prompt_token_len=n(prompt), prompt_feat=feat, prompt_feat_len=n(feat),
                                      embedding=emb, streaming=streaming, finalize=not streaming)
    return mel


def inputs(seed=1, tokens=60, prompt=20):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 6561, (1, tokens), generator=gen, dtype=torch.int32),
            torch.randint(0, 6561, (1, prompt), generator=gen, dtype=torch.int32),
            torch.randn(1, 2 * prompt, 80, generator=gen), torch.randn(1, 192, generator=gen))


@pytest.fixture(scope="module")
def pair(tiny_models, tmp_path_factory):
    d = tiny_models(2)
    cache = tmp_path_factory.mktemp("onnx")
    return (load_model_dir(d).model,
            load_model_dir(d, levers=configs.levers(flow_runtime="onnxruntime", onnx_cache_dir=str(cache))).model)


def estimator_calls(model):
    """Counts the torch estimator's forward calls (the ONNX path does not call it)."""
    calls = []
    model.flow.decoder.estimator.register_forward_pre_hook(lambda m, a: calls.append(int(a[0].shape[0])))
    return calls


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streaming"])
def test_onnx_mel_equals_torch(pair, streaming):
    ref_model, ort_model = pair
    onnx_est = onnx_of(ort_model.flow)
    assert onnx_est is not None and onnx_est.chunked and onnx_est.batch is None
    calls = estimator_calls(ort_model)
    before = onnx_est.frames
    tokens, prompt, feat, emb = inputs()
    ref = flow_mel(ref_model, tokens, prompt, feat, emb, streaming)
    got = flow_mel(ort_model, tokens, prompt, feat, emb, streaming)
    assert got.shape == ref.shape
    diff = float((got - ref).abs().max() / ref.abs().max())
    assert diff < MEL_BOUND, diff
    look = ort_model.flow.pre_lookahead_len if streaming else 0  # a streamed hop holds its look-ahead tokens back
    frames = 2 * (tokens.shape[1] + prompt.shape[1] - look)  # 2 mel frames per token
    assert calls == [] and onnx_est.frames - before == 10 * frames  # 10 ODE passes, all on ONNX Runtime


def test_streaming_and_whole_differ_so_the_mask_is_really_used(pair):
    _, ort_model = pair
    tokens, prompt, feat, emb = inputs(seed=2, tokens=90)
    a = flow_mel(ort_model, tokens, prompt, feat, emb, False)
    b = flow_mel(ort_model, tokens, prompt, feat, emb, True)  # shorter: holds back the look-ahead
    assert float((a[:, :, :b.shape[2]] - b).abs().max()) > 100 * MEL_BOUND * float(a.abs().max())


def test_cosyvoice1_estimator_on_onnx_equals_torch(tiny_models, tmp_path):
    d = tiny_models(1)
    ref = load_model_dir(d).model
    ort_model = load_model_dir(d, levers=configs.levers(flow_runtime="onnxruntime", onnx_cache_dir=str(tmp_path))).model
    est = onnx_of(ort_model.flow)
    assert est is not None and not est.chunked  # v1's estimator has no chunk mask
    gen = torch.Generator().manual_seed(0)
    x, mu, cond = (torch.randn(2, 80, 70, generator=gen) for _ in range(3))
    args = (x, torch.ones(2, 1, 70), mu, torch.rand(2, generator=gen), torch.randn(2, 80, generator=gen), cond)
    with torch.inference_mode():
        want = ref.flow.decoder.estimator(*args)
        got = ort_model.flow.decoder.forward_estimator(*args, False)
    assert float((got - want).abs().max() / want.abs().max()) < MEL_BOUND


# -- the export cache -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def estimator(tiny_models):
    return load_model_dir(tiny_models(2)).model.flow.decoder.estimator


def counting_exports(monkeypatch):
    calls = []
    real = flow_onnx.export

    def export(est, target):
        calls.append(1)
        return real(est, target)

    monkeypatch.setattr(flow_onnx, "export", export)
    return calls


def test_export_is_cached_by_weights_and_reused(estimator, tmp_path, monkeypatch, tiny_models):
    model_dir = tiny_models(2)
    listing = sorted(os.listdir(model_dir))
    exports = counting_exports(monkeypatch)
    first = load_onnx_estimator(estimator, model_dir=model_dir, cache_dir=tmp_path)
    key = weights_key(estimator)
    path = tmp_path / key[:32] / flow_onnx.CACHE_FILE
    assert first.source == "exported" and path.is_file() and len(exports) == 1
    assert sorted(os.listdir(path.parent)) == [flow_onnx.CACHE_FILE]  # no temporary file left behind
    mtime = path.stat().st_mtime_ns
    second = load_onnx_estimator(estimator, model_dir=model_dir, cache_dir=tmp_path)
    assert second.source == "cache" and len(exports) == 1 and path.stat().st_mtime_ns == mtime
    assert sorted(os.listdir(model_dir)) == listing  # nothing written into the model dir


def test_the_export_leaves_the_estimator_in_inference_mode(estimator):
    """torch.onnx.export restores the exported wrapper's mode onto every submodule: a wrapper left in
    training mode switched the loaded estimator's dropout on for the rest of the process."""
    import io

    assert not any(m.training for m in estimator.modules())
    flow_onnx.export(estimator, io.BytesIO())
    assert not any(m.training for m in estimator.modules())


def test_other_weights_get_another_key(estimator):
    import copy

    other = copy.deepcopy(estimator)
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)
    assert weights_key(other) != weights_key(estimator) and weights_key(estimator) == weights_key(estimator)


def test_a_failed_export_leaves_no_file(estimator, tmp_path, monkeypatch):
    def broken(est, target):
        target.write(b"half a graph")
        raise RuntimeError("export crashed")

    monkeypatch.setattr(flow_onnx, "export", broken)
    with pytest.raises(RuntimeError, match="export crashed"):
        load_onnx_estimator(estimator, model_dir=None, cache_dir=tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_damaged_cache_entry_is_exported_again(estimator, tmp_path):
    path = tmp_path / weights_key(estimator)[:32] / flow_onnx.CACHE_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an onnx graph")
    got = load_onnx_estimator(estimator, model_dir=None, cache_dir=tmp_path)
    assert got.source == "exported" and path.stat().st_size > 1000


def test_an_export_that_does_not_match_is_marked_and_not_tried_again(estimator, tmp_path, monkeypatch):
    exports = counting_exports(monkeypatch)
    monkeypatch.setattr(flow_onnx, "check", lambda onnx_est, est: 0.5)  # as CosyVoice3's DiT export measures
    with pytest.raises(flow_onnx.OnnxUnavailable, match="differs from the loaded estimator by 5.0e-01"):
        load_onnx_estimator(estimator, model_dir=None, cache_dir=tmp_path)
    folder = tmp_path / weights_key(estimator)[:32]
    assert sorted(os.listdir(folder)) == [flow_onnx.UNUSABLE_FILE] and len(exports) == 1  # no graph kept
    with pytest.raises(flow_onnx.OnnxUnavailable, match="an earlier export of these weights did not match"):
        load_onnx_estimator(estimator, model_dir=None, cache_dir=tmp_path)
    assert len(exports) == 1  # not exported again


def test_an_unwritable_cache_dir_keeps_the_graph_in_memory(estimator, tmp_path, monkeypatch):
    def refuse(path, est):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(flow_onnx, "_write_atomically", refuse)
    got = load_onnx_estimator(estimator, model_dir=None, cache_dir=tmp_path)
    assert got.source == "memory" and got.chunked


# -- a model dir's own file (upstream's export: batch 2, no chunk mask) -----------------------------------------
def upstream_style_export(est, path):
    """What upstream's export_onnx.py writes: six inputs, batch fixed at 2, full attention only."""
    gen = torch.Generator().manual_seed(0)
    t = 64
    args = (torch.rand(2, 80, t, generator=gen), torch.ones(2, 1, t), torch.rand(2, 80, t, generator=gen),
            torch.rand(2, generator=gen), torch.rand(2, 80, generator=gen), torch.rand(2, 80, t, generator=gen))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings (pytest turns warnings into errors)
        torch.onnx.export(est, args, str(path), dynamo=False, opset_version=18, input_names=list(flow_onnx.INPUTS),
                          output_names=["estimator_out"],
                          dynamic_axes={k: {2: "seq_len"} for k in ("x", "mask", "mu", "cond", "estimator_out")})


@pytest.fixture
def dir_with_onnx(tiny_models, tmp_path):
    d = tmp_path / "v2"
    shutil.copytree(tiny_models(2), d)
    return d


def test_the_model_dirs_file_serves_whole_calls_and_torch_the_streamed_ones(dir_with_onnx, tmp_path):
    ref = load_model_dir(dir_with_onnx).model
    upstream_style_export(ref.flow.decoder.estimator, dir_with_onnx / MODEL_DIR_FILE)
    cache = tmp_path / "cache"
    model = load_model_dir(dir_with_onnx, levers=configs.levers(flow_runtime="onnxruntime", onnx_cache_dir=str(cache))).model
    est = onnx_of(model.flow)
    assert est.source == "model dir" and est.batch == 2 and not est.chunked
    assert not cache.exists()  # nothing exported
    assert est.serves(2, False) and not est.serves(2, True) and not est.serves(1, False)
    calls = estimator_calls(model)
    tokens, prompt, feat, emb = inputs()
    for streaming in (False, True):
        want = flow_mel(ref, tokens, prompt, feat, emb, streaming)
        got = flow_mel(model, tokens, prompt, feat, emb, streaming)
        assert float((got - want).abs().max() / want.abs().max()) < MEL_BOUND
    assert calls == [2] * 10  # only the streamed call ran in torch


def test_a_model_dir_file_of_other_weights_is_not_used(dir_with_onnx, tmp_path, caplog):
    import copy

    est = load_model_dir(dir_with_onnx).model.flow.decoder.estimator
    stale = copy.deepcopy(est)
    with torch.no_grad():
        for p in stale.parameters():
            p.mul_(1.5)
    upstream_style_export(stale, dir_with_onnx / MODEL_DIR_FILE)
    with caplog.at_level(logging.WARNING, logger="cosyserve.engine"):
        got = load_onnx_estimator(est, model_dir=dir_with_onnx, cache_dir=tmp_path / "cache")
    assert got.source == "exported" and "differs from the loaded estimator" in caplog.text


# -- the engine --------------------------------------------------------------------------------------------
def test_onnxruntime_is_refused_with_a_bf16_flow(tiny_models, tmp_path):
    with pytest.raises(EngineFailure, match="choose one of the two"):
        load_model_dir(tiny_models(2), dtype="bf16", levers=configs.levers(flow_runtime="onnxruntime",
                                                                    onnx_cache_dir=str(tmp_path)))
    auto = load_model_dir(tiny_models(2), dtype="bf16", levers=configs.levers(flow_runtime="auto", onnx_cache_dir=str(tmp_path)))
    assert auto.levers.flow.runtime == "torch"  # auto: a bf16 flow stays on torch


@pytest.mark.parametrize("batching", [False, True], ids=["per-request", "batched"])
def test_engine_on_onnxruntime_speaks_as_torch_does(tiny_models, tmp_path, batching):
    """Same greedy tokens, so the audio of the two runtimes differs by float rounding only."""
    out = {}
    for runtime in ("torch", "onnxruntime"):
        eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=batching,
                                              llm_greedy=True, flow_runtime=runtime, onnx_cache_dir=str(tmp_path)))
        eng.load()
        try:
            assert eng.loaded.levers.flow.runtime == runtime
            for stream in (False, True):
                req = SynthesisRequest(text="Hello there, this is a short test.", mode="sft",
                                       speaker=eng.voices()[0], stream=stream, seed=3)
                chunks = list(eng.synthesize(req, threading.Event()))
                out[runtime, stream] = np.concatenate([c.pcm for c in chunks]).astype(np.int32)
        finally:
            eng.close()
    for stream in (False, True):
        a, b = out["torch", stream], out["onnxruntime", stream]
        assert len(a) == len(b) > 0
        assert np.abs(a - b).max() <= max(8, 0.01 * np.abs(a).max())  # int16 PCM: a few LSB of rounding


def test_the_session_plans_no_memory_pattern_per_shape(pair):
    # every request brings new shapes: a pattern per shape grew the arena without bound (docs/memory.md)
    _, ort_model = pair
    assert onnx_of(ort_model.flow).session.get_session_options().enable_mem_pattern is False


def test_a_long_call_leaves_no_arena_growth_behind(pair, monkeypatch):
    # ONNX Runtime's CPU arena only grows by default, by powers of two, and keeps a long call's working set
    # (its attention grows with the square of the length) for the process's life; every run shrinks it back
    # (docs/memory.md: +1.9 GB kept at full size without). Held: glibc's in-use bytes after the calls.
    from app import heap

    ort = pytest.importorskip("onnxruntime")
    if heap.usage() is None:
        pytest.skip("glibc's malloc counters are needed to see the arena")
    est = onnx_of(pair[1].flow)
    assert flow_onnx.run_options().get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"

    def held_after(frames: int) -> float:
        gen = torch.Generator().manual_seed(frames)
        x, mu, cond = (torch.randn(2, 80, frames, generator=gen) for _ in range(3))
        heap.trim()
        before = heap.usage()["in_use"]
        est(x, torch.ones(2, 1, frames), mu, torch.rand(2, generator=gen), torch.randn(2, 80, generator=gen), cond)
        heap.trim()
        return (heap.usage()["in_use"] - before) / 2**20

    shrunk = held_after(1500)
    monkeypatch.setattr(flow_onnx, "run_options", ort.RunOptions)  # the arena's default: the call's regions stay
    kept = held_after(1500)
    assert kept >= 20, kept  # the call's working set is large enough to see
    assert shrunk <= 4, shrunk
