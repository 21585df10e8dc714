"""``engine.flow_steps`` and ``engine.flow_cfg`` (flow/solver.py) on tiny CosyVoice2, real classes.

Our Euler solver must be CosyVoice's at the model's settings (10 steps, guided): checked to
float rounding against upstream's ``solve_euler`` on the same inputs. Fewer steps and no
guidance are meant to change the mel: checked by the estimator's work (steps x rows) and by
the flow cache, whose streamed hops must still equal the recomputing path with the same knobs.
"""

from __future__ import annotations

import threading

import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.base import SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.flow import cache as flow_cache
from app.engines.cosyvoice.flow.solver import options_of, solve, time_grid
from app.engines.cosyvoice.load import load_model_dir
from tests.support import configs
from tests.support.flow_streams import (
    EXACT,
    inputs,
    streamed_mel,
)


def flow_mel(flow, x):
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)
    with torch.inference_mode():
        mel, _ = flow.inference(token=x["token"], token_len=n(x["token"]), prompt_token=x["prompt"],
                                prompt_token_len=n(x["prompt"]), prompt_feat=x["feat"], prompt_feat_len=n(x["feat"]),
                                embedding=x["emb"], streaming=False, finalize=True)
    return mel


def passes(flow):
    """The estimator's calls as (rows, frames)."""
    calls = []
    flow.decoder.estimator.register_forward_pre_hook(lambda m, a: calls.append(tuple(a[0].shape[::2])))
    return calls


@pytest.fixture(scope="module")
def default_flow(tiny_models):
    return load_model_dir(tiny_models(2)).model.flow


def test_our_solver_is_cosyvoices_at_the_models_settings(default_flow):
    cfm = default_flow.decoder
    gen = torch.Generator().manual_seed(0)
    x, mu, cond = (torch.randn(1, 80, 90, generator=gen) for _ in range(3))
    mask, spks = torch.ones(1, 1, 90), torch.randn(1, 80, generator=gen)
    grid = time_grid(cfm, 10, x.device, x.dtype)
    with torch.inference_mode():
        for streaming in (False, True):
            want = cfm.solve_euler(x, t_span=grid, mu=mu, mask=mask, spks=spks, cond=cond, streaming=streaming)
            got = solve(cfm, x, grid, mu, mask, spks, cond, streaming, steps=10, cfg=True)
            assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())


def test_the_models_step_count_changes_nothing(tiny_models, default_flow):
    flow = load_model_dir(tiny_models(2), levers=configs.levers(flow_steps=10)).model.flow
    assert not options_of(flow.decoder).changes_solver
    x = inputs(n_tokens=40, n_prompt=20)
    assert torch.equal(flow_mel(flow, x), flow_mel(default_flow, x))


@pytest.mark.parametrize(("steps", "cfg", "rows"), [(5, True, 2), (10, False, 1), (4, False, 1)])
def test_steps_and_cfg_set_the_estimators_work(tiny_models, default_flow, steps, cfg, rows):
    flow = load_model_dir(tiny_models(2), levers=configs.levers(flow_steps=steps, flow_cfg=cfg)).model.flow
    calls = passes(flow)
    x = inputs(n_tokens=40, n_prompt=20)
    got, want = flow_mel(flow, x), flow_mel(default_flow, x)
    assert calls == [(rows, 2 * 40 + 2 * 20)] * steps
    assert got.shape == want.shape and bool(torch.isfinite(got).all())
    assert float((got - want).abs().max()) > 1e-3  # it does change the mel (docs warn so)


@pytest.mark.parametrize(("steps", "cfg"), [(10, False), (4, True)])
def test_the_flow_cache_follows_the_knobs_exactly(tiny_models, steps, cfg):
    flow = load_model_dir(tiny_models(2), levers=configs.levers(flow_steps=steps, flow_cfg=cfg)).model.flow
    flow_cache.install(flow)
    calls = passes(flow)
    x = inputs(seed=3)
    ref, _ = streamed_mel(flow, x)  # the recomputing path, through our solver
    n_ref = len(calls)
    stream = flow_cache.FlowStream()
    got, _ = streamed_mel(flow, x, stream)  # the cached path, through flow_cache's solver
    assert float((got - ref).abs().max()) <= EXACT * float(ref.abs().max())
    assert {c[0] for c in calls} == {2 if cfg else 1} and (len(calls) - n_ref) % steps == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_engine_with_every_lever_speaks(tiny_models, tmp_path, stream):
    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=True,
                                          llm_greedy=True, llm_quantization="int8", flow_runtime="onnxruntime",
                                          flow_steps=5, flow_cfg=False, onnx_cache_dir=str(tmp_path)))
    eng.load()
    try:
        applied = eng.loaded.levers
        assert applied.llm_int8_layers > 0 and applied.flow.runtime == "onnxruntime"
        assert "5 flow steps" in applied.describe() and "CFG off" in applied.describe()
        req = SynthesisRequest(text="Hello there, this is a short test.", mode="sft", speaker=eng.voices()[0],
                               stream=stream, seed=3)
        chunks = list(eng.synthesize(req, threading.Event()))
    finally:
        eng.close()
    assert sum(len(c.pcm) for c in chunks) > eng.sample_rate // 2
