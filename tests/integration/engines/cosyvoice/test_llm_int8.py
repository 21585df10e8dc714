"""The int8 LLM (``engine.llm_quantization: int8``) against fp32 on tiny CosyVoice2 (real classes).

Bounds and their reasons: dynamic int8 quantizes each Linear's weights per tensor (256 levels
over the weight range) and each step's activations per tensor, so every projection carries a
relative error of order 1/256 of its largest value (~0.5%); the tiny model has 2 decoder layers
and its random speech head turns hidden-state errors into log-prob errors of the same order.
Measured here (4 sequences x 60 teacher-forced steps): largest log-prob difference 0.009 over
tokens with probability >= 1e-4, KL 2e-6 nats, greedy agreement 100%. The bounds are ~5-20x
those: loose enough for other CPUs' int8 kernels, tight enough to catch an unquantized
activation path gone wrong (a scale error moves log-probs by whole nats) or a quantized speech
head. Full size (24 layers) is measured by ``python -m tests.support.llm_int8`` (docs/cpu.md).
"""

from __future__ import annotations

import copy
import threading

import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.base import EngineFailure, SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.llm.forward import BatchedLM
from app.engines.cosyvoice.load import load_model_dir
from app.engines.cosyvoice.quantize import quantize_llm_int8
from tests.support import configs
from tests.support.llm_int8 import compare

MAX_ABS_LOGPROB = 0.1  # nats, over tokens fp32 gives >= 1e-4
MAX_KL = 1e-4  # nats per step
MIN_AGREEMENT = 0.95  # greedy tokens


@pytest.fixture(scope="module")
def pair(tiny_models):
    ref = load_model_dir(tiny_models(2)).model.llm
    q = copy.deepcopy(ref)
    layers = quantize_llm_int8(q)
    return ref, q, layers


def test_only_the_backbone_and_the_text_head_are_int8(pair):
    ref, q, layers = pair
    backbone = q.llm.model.model
    n_layers = len(backbone.layers)
    assert layers == 7 * n_layers + 1  # q, k, v, o, gate, up, down per layer + the unused text head
    assert not any(type(m) is torch.nn.Linear for m in backbone.layers.modules())
    assert type(q.llm_decoder) is torch.nn.Linear and q.llm_decoder.weight.dtype == torch.float32  # speech head fp32
    assert backbone.embed_tokens.weight.dtype == torch.float32 and q.speech_embedding.weight.dtype == torch.float32
    assert type(ref.llm.model.model.layers[0].self_attn.q_proj) is torch.nn.Linear  # the reference is untouched


def test_int8_log_probs_stay_within_the_bounds(pair):
    ref, q, _ = pair
    with torch.inference_mode():
        got = compare(BatchedLM(ref), BatchedLM(q), sequences=4, steps=60)
    assert got["steps"] == 4 * 61
    assert got["max_abs_logprob_diff"] < MAX_ABS_LOGPROB, got
    assert got["kl_max"] < MAX_KL, got
    assert got["greedy_agreement"] >= MIN_AGREEMENT, got
    assert got["max_abs_logprob_diff"] > 0  # it is quantized: not bit-equal to fp32


def test_int8_log_probs_are_fp32(pair):
    _, q, _ = pair
    lm = BatchedLM(q)
    empty = torch.zeros(1, 0, dtype=torch.int32)
    with torch.inference_mode():
        x, _, _ = lm.prefix(torch.tensor([[5, 6, 7]], dtype=torch.int32), empty, empty)
        kv = lm.new_cache()
        _, logp = lm.prefill(kv, x)
        assert logp.dtype == torch.float32 and lm.decode(kv, [1]).dtype == torch.float32


def test_refused_for_cosyvoice1_and_for_a_bf16_llm(tiny_models):
    with pytest.raises(EngineFailure, match="needs a CosyVoice2/3 model"):
        load_model_dir(tiny_models(1), levers=configs.levers(llm_quantization="int8"))
    with pytest.raises(EngineFailure, match="choose one of the two"):
        load_model_dir(tiny_models(2), dtype="bf16", dtype_stages=("llm",), levers=configs.levers(llm_quantization="int8"))
    # bf16 for the flow only leaves the LLM fp32: int8 applies
    lm = load_model_dir(tiny_models(2), dtype="bf16", dtype_stages=("flow",), levers=configs.levers(llm_quantization="int8"))
    assert lm.levers.llm_int8_layers > 0


@pytest.mark.parametrize("batching", [False, True], ids=["per-request", "batched"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_int8_engine_speaks(tiny_models, batching, stream):
    eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(2)), torch_threads=1, batching=batching,
                                          llm_greedy=True, llm_quantization="int8"))
    eng.load()
    try:
        assert eng.loaded.levers.llm_int8_layers > 0
        req = SynthesisRequest(text="Hello there, this is a short test.", mode="sft", speaker=eng.voices()[0],
                               stream=stream, seed=3)
        chunks = list(eng.synthesize(req, threading.Event()))
    finally:
        eng.close()
    assert sum(len(c.pcm) for c in chunks) > eng.sample_rate // 2
    assert len(chunks) >= (2 if stream else 1)
