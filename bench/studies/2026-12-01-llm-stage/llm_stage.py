"""The LLM stage alone: CosyVoice's own per-request decoding vs our batched scheduler.

    python -m bench.studies.2026-12-01-llm-stage.llm_stage MODEL_DIR [--concurrency 1,8,16] [--workers 2] [--requests N]

Both systems decode the same sft requests (one fixed sentence, the model's first
preset speaker) on the same loaded model, one system at a time:

* per-request: ``workers`` threads, each running CosyVoice's ``llm.inference`` for
  one request after another (what each slot of the per-request pool does);
* batched: ``c`` requests in flight in one :class:`LLMScheduler` (closed loop: a
  finished request is replaced at once), so up to ``c`` sequences share each step.

Printed per point: speech tokens per wall second, ms per decode step, mean batch.
No token2wav runs here: this isolates what batching does to the LLM.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."


def _inputs(model_dir: str):
    import torch

    from app.engines.cosyvoice.load import load_model_dir

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    lm = load_model_dir(model_dir)
    print(f"loaded {model_dir} in {time.perf_counter() - t0:.1f} s", flush=True)
    spk = sorted(k for k, v in lm.frontend.spk2info.items() if "embedding" in v)[0]
    return lm, lm.frontend.frontend_sft(TEXT, spk)


def per_request(llm, model_input: dict, workers: int, requests: int) -> dict:
    import torch

    empty = torch.zeros(1, 0, dtype=torch.int32)
    counts: list[int] = []
    lock = threading.Lock()
    todo = list(range(requests))

    def one() -> None:
        with torch.inference_mode():
            tokens = list(llm.inference(
                text=model_input["text"], text_len=torch.tensor([model_input["text"].shape[1]], dtype=torch.int32),
                prompt_text=empty, prompt_text_len=torch.tensor([0], dtype=torch.int32),
                prompt_speech_token=empty, prompt_speech_token_len=torch.tensor([0], dtype=torch.int32),
                embedding=model_input["llm_embedding"]))
        with lock:
            counts.append(len(tokens))

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                todo.pop()
            one()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(counts)
    return {"system": "per_request", "workers": workers, "requests": requests, "tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall, "mean_batch": 1.0,
            "step_ms": 1000 * wall * workers / max(1, tokens)}


class _Steps:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.seconds: list[float] = []
        self.tokens = 0

    def on_step(self, batch_size: int, seconds: float) -> None:
        self.sizes.append(batch_size)
        self.seconds.append(seconds)

    def on_tokens(self, n: int) -> None:
        self.tokens += n


def batched(llm, model_input: dict, concurrency: int, requests: int) -> dict:
    import torch

    from app.engines.cosyvoice.llm.forward import BatchedLM
    from app.engines.cosyvoice.llm.scheduler import LLMScheduler

    steps = _Steps()
    blm = BatchedLM(llm)
    sched = LLMScheduler(blm, max_batch_size=max(16, concurrency), observer=steps)
    sched.start()
    empty = torch.zeros(1, 0, dtype=torch.int32)
    with torch.inference_mode():
        x, lo, hi = blm.prefix(model_input["text"], empty, empty)
    try:
        t0 = time.perf_counter()
        running = [sched.submit(x, lo, hi, seed=i) for i in range(min(concurrency, requests))]
        started, tokens = len(running), 0
        while running:
            seq = running.pop(0)
            seq.wait_for(1 << 30)
            tokens += len(seq.tokens)
            if started < requests:
                running.append(sched.submit(x, lo, hi, seed=started))
                started += 1
        wall = time.perf_counter() - t0
    finally:
        sched.stop()
    return {"system": "batched", "concurrency": concurrency, "requests": requests, "tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall,
            "mean_batch": statistics.fmean(steps.sizes) if steps.sizes else 0.0,
            "step_ms": 1000 * statistics.median(steps.seconds) if steps.seconds else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--workers", type=int, default=2, help="per-request threads (the pool's best on 2 cores)")
    ap.add_argument("--requests", type=int, default=0, help="requests per point (default: 2 x concurrency, >= 4)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    lm, model_input = _inputs(args.model_dir)
    llm = lm.model.llm
    rows = []
    n_pr = args.requests or 4
    rows.append(per_request(llm, model_input, args.workers, n_pr))
    print(json.dumps(rows[-1]), flush=True)
    for c in [int(x) for x in args.concurrency.split(",")]:
        rows.append(batched(llm, model_input, c, args.requests or max(4, 2 * c)))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["tokens_per_s"]
    print(f"\nper-request pool ({args.workers} threads): {base:.1f} speech tokens/s")
    for r in rows[1:]:
        print(f"batched c={r['concurrency']:>2}: {r['tokens_per_s']:6.1f} tokens/s = {r['tokens_per_s'] / base:4.2f}x, "
              f"mean batch {r['mean_batch']:.1f}, step {r['step_ms']:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
