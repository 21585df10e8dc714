"""The flow's first hop with and without a registered voice's prompt cache, flow only (no LLM, no HiFT).

    python -m bench.studies.2026-12-01-flow-prompt.flow_prompt                      # tiny v2
    python -m bench.studies.2026-12-01-flow-prompt.flow_prompt --model-dir .cache/full2 --repeats 2

The same first streamed call (50 prompt tokens, the first 25-token hop + 3 look-ahead)
through ``flow.inference`` with ``engine.flow_cache``'s incremental path: once with the
prompt cache off, once as a hit (the voice's state stored by an earlier call),
interleaved ``--repeats`` times. Prints the estimator frames and the calling thread's CPU
seconds (``time.thread_time``: unlike wall time, barely moved by other processes on a
shared machine) of each, and the first hop's mel difference between the two.
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=None, help="a CosyVoice2 dir (default: the tiny v2)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=50)
    args = ap.parse_args(argv)
    import torch

    from app.engines.cosyvoice.flow import cache as flow_cache
    from app.engines.cosyvoice.load import load_model_dir

    torch.set_num_threads(1)
    if args.model_dir is None:
        from bench.lib.model import ensure_model

        args.model_dir = ensure_model(2)
    flow = load_model_dir(args.model_dir, dtype="fp32").model.flow
    flow_cache.install(flow)
    gen = torch.Generator().manual_seed(0)
    n_prompt = args.prompt_tokens
    prompt = torch.randint(0, 6561, (1, n_prompt), generator=gen, dtype=torch.int32)
    feat = torch.randn(1, 2 * n_prompt, 80, generator=gen)
    emb = torch.randn(1, 192, generator=gen)
    pad = -(-n_prompt // 25) * 25 - n_prompt
    token = torch.randint(0, 6561, (1, 25 + pad + 3), generator=gen, dtype=torch.int32)
    n = lambda t: torch.tensor([t.shape[1]], dtype=torch.int32)
    cache = flow_cache.PromptCache(1 << 34)
    key = flow_cache.prompt_key(prompt, feat, emb)

    def first_hop(stream: flow_cache.FlowStream) -> tuple[torch.Tensor, float]:
        t0 = time.thread_time()
        with torch.inference_mode(), flow_cache.bound_stream(stream):
            mel, _ = flow.inference(token=token, token_len=n(token), prompt_token=prompt, prompt_token_len=n(prompt),
                                    prompt_feat=feat, prompt_feat_len=n(feat), embedding=emb, streaming=True,
                                    finalize=False)
        return mel, time.thread_time() - t0

    first_hop(flow_cache.FlowStream(prompt_cache=cache, prompt_key=key))  # the miss: stores the voice's state
    print(f"model {args.model_dir}: {n_prompt} prompt tokens, cacheable prompt frames "
          f"{flow_cache.cacheable_prompt_frames(flow, n_prompt)}, stored state {cache.bytes / 2**20:.1f} MiB")
    for r in range(args.repeats):
        plain, hit = flow_cache.FlowStream(), flow_cache.FlowStream(prompt_cache=cache, prompt_key=key)
        a, cpu_a = first_hop(plain)
        b, cpu_b = first_hop(hit)
        diff = float((a - b).abs().max() / a.abs().max())
        print(f"repeat {r}: first hop without the prompt cache {plain.frames_computed} frames {cpu_a:.2f} CPU s; "
              f"hit {hit.frames_computed} frames {cpu_b:.2f} CPU s ({cpu_a / cpu_b:.2f}x); "
              f"max |diff| / max |mel| {diff:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
