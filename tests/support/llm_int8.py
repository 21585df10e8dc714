"""int8 LLM (``engine.llm_quantization: int8``) against fp32: accuracy and decode-step time.

    python -m tests.support.llm_int8 --model-dir .cache/full2      # full-size v2 (~3 min on 2 cores)
    python -m tests.support.llm_int8 --model-dir DIR --steps 40 --quick

One process, one torch thread. The fp32 LLM and an int8 copy of it decode the same
sequences through the batched forward (``BatchedLM``), teacher-forced: both are fed the
fp32 model's greedy token at every step, so each step compares the two distributions at
the same history. Reported over all steps of all sequences: the largest absolute log-prob
difference over the tokens fp32 gives at least 1e-4 probability, KL(fp32 || int8) (mean and
largest), greedy agreement (int8's most likely token is fp32's), and the logits' relative error
(the norm of the difference over the norm of fp32's, each centred per step: independent of how
peaked the distribution is); and, to say how peaked the distributions compared were (random
weights are flatter than a trained model's), fp32's mean entropy, top-1 probability and gap
between its two most likely tokens. Then the decode step's
time at batch 1, 8 and 16 over a 60-position cache for both. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from typing import Any


def compare(ref_lm: Any, q_lm: Any, *, sequences: int, steps: int, text_tokens: int = 20, seed: int = 0) -> dict:
    """Teacher-forced decode of ``sequences`` random texts for ``steps`` steps in both models."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    empty = torch.zeros(1, 0, dtype=torch.int32)
    kv_ref, kv_q = ref_lm.new_cache(), q_lm.new_cache()
    last_ref, last_q = [], []
    for _ in range(sequences):
        text = torch.randint(0, 3000, (1, text_tokens), generator=gen, dtype=torch.int32)
        x_ref, _, _ = ref_lm.prefix(text, empty, empty)
        x_q, _, _ = q_lm.prefix(text, empty, empty)
        last_ref.append(ref_lm.prefill(kv_ref, x_ref)[1])
        last_q.append(q_lm.prefill(kv_q, x_q)[1])
    lp_ref, lp_q = torch.stack(last_ref), torch.stack(last_q)
    max_abs, kls, agree, total, entropy, top1, rel, margin = 0.0, [], 0, 0, 0.0, 0.0, 0.0, 0.0
    speech = ref_lm.spec.speech_token_size
    for step in range(steps + 1):
        p = lp_ref.exp()
        relevant = p >= 1e-4
        max_abs = max(max_abs, float((lp_q - lp_ref).abs()[relevant].max()))
        kls.extend((p * (lp_ref - lp_q)).sum(-1).tolist())
        agree += int((lp_q.argmax(-1) == lp_ref.argmax(-1)).sum())
        entropy += float(-(p * lp_ref).nan_to_num().sum(-1).sum())
        top1 += float(p.max(-1).values.sum())
        centred = lp_ref - lp_ref.mean(-1, keepdim=True)  # logits up to a constant per row
        diff = (lp_q - lp_ref) - (lp_q - lp_ref).mean(-1, keepdim=True)
        rel += float((diff.norm(dim=-1) / centred.norm(dim=-1)).sum())
        best = lp_ref.topk(2, dim=-1).values
        margin += float((best[:, 0] - best[:, 1]).sum())
        total += lp_ref.shape[0]
        if step == steps:
            break
        tokens = lp_ref[:, :speech].argmax(-1).tolist()  # fp32's greedy speech token, fed to both
        lp_ref, lp_q = ref_lm.decode(kv_ref, tokens), q_lm.decode(kv_q, tokens)
    return {"steps": total, "max_abs_logprob_diff": max_abs, "kl_mean": sum(kls) / len(kls), "kl_max": max(kls),
            "greedy_agreement": agree / total,
            "logit_rel_err_mean": rel / total, "fp32_entropy_nats_mean": entropy / total,
            "fp32_top1_prob_mean": top1 / total, "fp32_top2_margin_nats_mean": margin / total}


def step_ms(lm: Any, batch: int, positions: int = 60, repeats: int = 5, seed: int = 0) -> float:
    """Median decode-step time (ms) of ``batch`` rows over a ``positions``-long cache."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    kv = lm.new_cache()
    width = lm.llm.llm_decoder.in_features
    for _ in range(batch):
        lm.prefill(kv, 0.02 * torch.randn(1, positions, width, generator=gen))
    tokens = [1] * batch
    for _ in range(2):
        lm.decode(kv, tokens)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        lm.decode(kv, tokens)
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100, help="decode steps per sequence (plus the prefill's)")
    ap.add_argument("--quick", action="store_true", help="accuracy only, no step timing")
    args = ap.parse_args(argv)

    import torch

    from app.engines.cosyvoice.llm.forward import BatchedLM
    from app.engines.cosyvoice.load import load_model_dir
    from app.engines.cosyvoice.quantize import quantize_llm_int8

    torch.set_num_threads(1)
    loaded = load_model_dir(args.model_dir)
    ref_llm = loaded.model.llm
    q_llm = copy.deepcopy(ref_llm)
    quantized = quantize_llm_int8(q_llm)
    ref_lm, q_lm = BatchedLM(ref_llm), BatchedLM(q_llm)
    out: dict = {"model_dir": str(loaded.model_dir.name), "linear_layers_int8": quantized}
    with torch.inference_mode():
        out["accuracy"] = compare(ref_lm, q_lm, sequences=args.sequences, steps=args.steps)
        if not args.quick:
            out["step_ms"] = {f"batch{b}": {"fp32": step_ms(ref_lm, b), "int8": step_ms(q_lm, b)} for b in (1, 8, 16)}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
