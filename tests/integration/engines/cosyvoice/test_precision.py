"""bf16 stages against fp32 on the same inputs (tiny CosyVoice2, real classes), and per-stage timings.

Bounds: bf16 keeps 8 significant bits, so each rounding is off by at most 2^-9 (0.2%)
relative; errors grow with depth (2 Qwen2 layers in the LLM; the flow runs 10 ODE
steps of a multi-block estimator, each feeding the next). Measured here: LLM
log-probs 0.35% (prefill) / 0.04% (decode step), flow mel 4.0%, HiFT waveform 8%.
The bounds are ~2.5-5x those: loose enough for other CPUs' kernels, tight enough to
catch a stage left unconverted on one side, a missing input cast (an error) or a
wrong format such as fp16 overflow (errors of order 100%).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.base import SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.llm.forward import BatchedLM
from app.engines.cosyvoice.load import load_model_dir
from tests.support import configs

LLM_BOUND = 0.02
FLOW_BOUND = 0.10
HIFT_BOUND = 0.25


def rel(x, ref) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


@pytest.fixture(scope="module")
def pair(tiny_models):
    d = tiny_models(2)
    return load_model_dir(d, dtype="fp32"), load_model_dir(d, dtype="bf16", dtype_stages=("llm", "flow", "hift"))


def test_bf16_weights_where_asked_fp32_elsewhere(tiny_models):
    lm = load_model_dir(tiny_models(2), dtype="bf16")  # default stages: llm, flow
    m = lm.model
    assert lm.precision.dtype == "bf16" and lm.precision.stages == ("llm", "flow")
    assert m.llm.llm_decoder.weight.dtype == torch.bfloat16
    assert next(m.flow.decoder.estimator.parameters()).dtype == torch.bfloat16
    assert next(m.flow.encoder.parameters()).dtype == torch.bfloat16
    assert m.flow.input_embedding.weight.dtype == torch.float32  # the cheap parts stay fp32
    assert all(p.dtype == torch.float32 for p in m.hift.parameters())


def test_llm_log_probs_match_fp32(pair):
    a, b = pair
    la, lb = BatchedLM(a.model.llm), BatchedLM(b.model.llm)
    gen = torch.Generator().manual_seed(0)
    text = torch.randint(0, 3000, (1, 20), generator=gen, dtype=torch.int32)
    empty = torch.zeros(1, 0, dtype=torch.int32)
    with torch.inference_mode():
        xa, _, _ = la.prefix(text, empty, empty)
        xb, _, _ = lb.prefix(text, empty, empty)
        assert xb.dtype == torch.bfloat16 and lb.new_cache().dtype == torch.bfloat16
        kva, kvb = la.new_cache(), lb.new_cache()
        _, pa = la.prefill(kva, xa)
        _, pb = lb.prefill(kvb, xb)
        assert pb.dtype == torch.float32  # sampling sees fp32 log-probs
        assert rel(pb, pa) < LLM_BOUND
        step = [int(pa.argmax())]
        assert rel(lb.decode(kvb, step), la.decode(kva, step)) < LLM_BOUND
        # CosyVoice's own per-request decoding runs the same bf16 modules
        ya = a.model.llm.llm_decoder(a.model.llm.llm.model.model.embed_tokens(text.long()))
        yb = b.model.llm.llm_decoder(b.model.llm.llm.model.model.embed_tokens(text.long()))
        assert yb.dtype == torch.float32 and rel(yb, ya) < LLM_BOUND


def flow_mel(model, tokens, prompt_tokens, prompt_feat, embedding):
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)
    mel, _ = model.flow.inference(token=tokens, token_len=n(tokens), prompt_token=prompt_tokens,
                                  prompt_token_len=n(prompt_tokens), prompt_feat=prompt_feat,
                                  prompt_feat_len=n(prompt_feat), embedding=embedding, streaming=False, finalize=True)
    return mel


def test_flow_and_hift_match_fp32(pair):
    a, b = pair
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 6561, (1, 60), generator=gen, dtype=torch.int32)
    prompt = torch.randint(0, 6561, (1, 20), generator=gen, dtype=torch.int32)
    feat = torch.randn(1, 40, 80, generator=gen)
    emb = torch.randn(1, 192, generator=gen)
    with torch.inference_mode():
        ma, mb = flow_mel(a.model, tokens, prompt, feat, emb), flow_mel(b.model, tokens, prompt, feat, emb)
        assert mb.dtype == torch.float32 and mb.shape == ma.shape == (1, 80, 120)
        assert rel(mb, ma) < FLOW_BOUND
        wa, _ = a.model.hift.inference(speech_feat=ma)
        wb, _ = b.model.hift.inference(speech_feat=ma)  # same mel in: HiFT's own error only
        assert wb.dtype == torch.float32 and wb.shape == wa.shape
        assert rel(wb, wa) < HIFT_BOUND


@pytest.mark.parametrize("batching", [False, True], ids=["per-request", "batched"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_bf16_engine_speaks_and_times_its_stages(tiny_models, batching, stream):
    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), dtype="bf16", torch_threads=1,
                                          batching=batching, llm_greedy=True))
    eng.load()
    try:
        req = SynthesisRequest(text="Hello there, this is a short test.", mode="sft", speaker=eng.voices()[0],
                               stream=stream, seed=3)
        chunks = list(eng.synthesize(req, threading.Event()))
    finally:
        eng.close()
    pcm = np.concatenate([c.pcm for c in chunks])
    assert len(pcm) > eng.sample_rate // 2 and np.abs(pcm.astype(np.int32)).max() > 0
    if stream:
        assert len(chunks) >= 2
    stages = req.timings.snapshot()
    assert set(stages) == {"frontend", "llm", "flow", "hift"}, stages  # encode is the serving layer's
    assert all(v > 0 for v in stages.values()), stages
