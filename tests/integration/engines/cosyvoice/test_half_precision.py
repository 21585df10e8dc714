"""Half precision that means what it says (tiny CosyVoice2, real classes, on the CPU).

* Rotary frequencies stay fp32 whatever the weights' dtype: a plain ``llm.to(bf16)`` casts
  the ``inv_freq`` buffer too, and the angle ``position x inv_freq`` is then off by radians
  at position 2047 (shown below); ours matches fp32 at every position 0..2047 to the
  rounding of cos/sin themselves in the weights' dtype.
* ``engine.dtype: fp16`` on CUDA puts the LLM (and so the batched KV cache) in half
  precision with fp32 softmax/log-probs, the flow under fp16 autocast and HiFT in fp32.
  fp16 matmuls run on a CPU too (slowly), so the same code path is checked here: the
  cache is fp16, log-probs fp32 and within a bound of fp32's, the flow's weights fp32
  and its output close to fp32's.

Bounds: fp16 keeps 11 significant bits (rounding 2^-12 relative), bf16 8 (2^-9): cos/sin
in [-1, 1] are then off by at most 2^-12 / 2^-9 (absolute). Log-probs, relative L2, worst
row over 40 teacher-forced decode steps: measured 0.14% (fp16) and 1.0% (bf16; prefill
0.06% / 0.36%); bounds 0.5% / 2% (bf16's as in test_precision.py). Flow under fp16
autocast: measured 0.08%, bound 5% (fp16 overflow would be off by far more; a flow left
out of autocast fails the dtype check).
"""

from __future__ import annotations

import copy

import pytest

pytestmark = [pytest.mark.integration]

torch = pytest.importorskip("torch")

from app.engines.cosyvoice.llm.forward import BatchedLM  # noqa: E402
from app.engines.cosyvoice.load import load_model_dir  # noqa: E402
from app.engines.cosyvoice.precision import Precision, apply_precision, llm_in  # noqa: E402

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
COS_BOUND = {"bf16": 2.0**-9, "fp16": 2.0**-12}  # half a unit in the last place of values in [0.5, 1]
LOGP_BOUND = {"bf16": 0.02, "fp16": 0.005}


@pytest.fixture(scope="module")
def fp32(tiny_models):
    return load_model_dir(tiny_models(2), dtype="fp32")


def rel(x, ref) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def rotary(llm):
    return llm.llm.model.model.rotary_emb


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_rotary_angles_stay_exact_at_every_position_up_to_2047(fp32, name):
    dtype = HALF[name]
    positions = torch.arange(2048).unsqueeze(0)
    x32 = torch.zeros(1, 1, dtype=torch.float32)
    want_cos, want_sin = rotary(fp32.model.llm)(x32, positions)

    ours = copy.deepcopy(fp32.model.llm)
    llm_in(ours, dtype)
    assert ours.llm_decoder.weight.dtype == dtype
    for buf in ("inv_freq", "original_inv_freq"):
        kept = getattr(rotary(ours), buf)
        assert kept.dtype == torch.float32 and torch.equal(kept, getattr(rotary(fp32.model.llm), buf))
    assert "inv_freq" in dict(rotary(ours).named_buffers())  # still a buffer (moves with .to(device))
    cos, sin = rotary(ours)(torch.zeros(1, 1, dtype=dtype), positions)
    assert cos.dtype == dtype
    err = max(float((cos.float() - want_cos).abs().max()), float((sin.float() - want_sin).abs().max()))
    assert err <= COS_BOUND[name], f"{name}: cos/sin off by {err:.2e}"

    plain = copy.deepcopy(fp32.model.llm).to(dtype)  # what a plain cast does to the angles
    cos_p, _ = rotary(plain)(torch.zeros(1, 1, dtype=dtype), positions)
    assert float((cos_p.float() - want_cos).abs().max()) > 50 * COS_BOUND[name]


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_the_half_precision_batched_llm_keeps_a_half_cache_and_fp32_log_probs_near_fp32(fp32, name):
    dtype = HALF[name]
    half = copy.deepcopy(fp32.model.llm)
    llm_in(half, dtype)
    ref, low = BatchedLM(fp32.model.llm), BatchedLM(half)
    gen = torch.Generator().manual_seed(0)
    texts = [torch.randint(0, 3000, (1, n), generator=gen, dtype=torch.int32) for n in (12, 30)]
    empty = torch.zeros(1, 0, dtype=torch.int32)
    with torch.inference_mode():
        kv32, kvh = ref.new_cache(), low.new_cache()
        last = []
        for text in texts:
            _, p32 = ref.prefill(kv32, ref.prefix(text, empty, empty)[0])
            _, ph = low.prefill(kvh, low.prefix(text, empty, empty)[0])
            assert ph.dtype == torch.float32 and rel(ph, p32) < LOGP_BOUND[name]
            last.append(int(p32.argmax()))
        assert kvh.dtype == dtype and kvh.k[0].dtype == dtype and kv32.k[0].dtype == torch.float32
        worst, agree = 0.0, 0
        for _ in range(40):  # teacher-forced on fp32's greedy tokens: the drift of one step each time
            l32, lh = ref.decode(kv32, last), low.decode(kvh, last)
            assert lh.dtype == torch.float32 and lh.shape == l32.shape
            worst = max(worst, max(rel(lh[r], l32[r]) for r in range(len(last))))
            agree += sum(int(lh[r].argmax()) == int(l32[r].argmax()) for r in range(len(last)))
            last = [int(l32[r].argmax()) for r in range(len(last))]
    assert worst < LOGP_BOUND[name], f"{name}: log-probs off by {worst:.4f} (relative L2)"
    assert agree >= 0.9 * 40 * len(texts)


def test_fp16_puts_the_llm_in_half_the_flow_under_autocast_and_leaves_hift_alone(fp32, tiny_models):
    other = load_model_dir(tiny_models(2), dtype="fp32")
    apply_precision(Precision("fp16", stages=("llm", "flow"), llm_dtype="fp16"),
                    other.model.llm, other.model.flow, other.model.hift)
    m = other.model
    assert m.llm.llm_decoder.weight.dtype == torch.float16
    assert rotary(m.llm).inv_freq.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in m.flow.parameters())  # autocast: the weights stay fp32
    assert all(p.dtype == torch.float32 for p in m.hift.parameters())
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 6561, (1, 60), generator=gen, dtype=torch.int32)
    prompt = torch.randint(0, 6561, (1, 20), generator=gen, dtype=torch.int32)
    feat, emb = torch.randn(1, 40, 80, generator=gen), torch.randn(1, 192, generator=gen)
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)  # noqa: E731
    seen = []
    inner = next(x for x in m.flow.decoder.estimator.modules() if isinstance(x, torch.nn.Linear))
    hook = inner.register_forward_hook(lambda mod, a, out: seen.append(out.dtype))
    try:
        with torch.inference_mode():
            kw = dict(token=tokens, token_len=n(tokens), prompt_token=prompt, prompt_token_len=n(prompt),
                      prompt_feat=feat, prompt_feat_len=n(feat), embedding=emb, streaming=False, finalize=True)
            mel, _ = m.flow.inference(**kw)
            want, _ = fp32.model.flow.inference(**kw)
    finally:
        hook.remove()
    assert seen and set(seen) == {torch.float16}  # the estimator's matmuls ran in fp16 ...
    assert mel.dtype == torch.float32 and mel.shape == want.shape  # ... and HiFT gets fp32 mel
    assert rel(mel, want) < 0.05
