"""Facts about a (full-size) random-weight CosyVoice2 dir: load time, RSS, speech tokens per text, LLM step time.

    python -m bench.studies.2026-12-01-fullsize-check.fullsize_check .cache/full2 [--text "..."]...

Loads the dir with the server's own loader (``load_model_dir``: strict state dicts),
runs the loaded LLM's real ``inference`` (sft, no prompt) on each text and prints one
JSON line. One torch thread, like a benchmark worker.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import psutil

from bench.lib.batching_plan import FULL_TEXT

SHORT = "Hello there, how are you?"


def llm_tokens(loaded, text: str) -> dict:
    import torch

    ids = loaded.frontend._extract_text_token(text)[0]
    n_text = int(ids.shape[1])
    empty = torch.zeros(1, 0, dtype=torch.int32)
    zero = torch.tensor([0], dtype=torch.int32)
    t0 = time.monotonic()
    stamps = []
    with torch.inference_mode():
        for _ in loaded.model.llm.inference(text=ids, text_len=torch.tensor([n_text], dtype=torch.int32),
                                            prompt_text=empty, prompt_text_len=zero, prompt_speech_token=empty,
                                            prompt_speech_token_len=zero, embedding=torch.zeros(1, 192)):
            stamps.append(time.monotonic())
    steps = [b - a for a, b in itertools.pairwise(stamps)]
    return {"text": text, "text_tokens": n_text, "min_tokens": 2 * n_text, "speech_tokens": len(stamps),
            "seconds": round(time.monotonic() - t0, 3), "first_token_s": round(stamps[0] - t0, 3) if stamps else None,
            "step_ms_median": round(1000 * sorted(steps)[len(steps) // 2], 1) if steps else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--text", action="append", help=f"default: {SHORT!r} and the benchmark sentence")
    ap.add_argument("--repeat", type=int, default=1, help="runs per text (the stop is sampled)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from app.engines.cosyvoice.load import load_model_dir

    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t0 = time.monotonic()
    loaded = load_model_dir(args.model_dir)
    load_s = time.monotonic() - t0
    rss = proc.memory_info().rss
    runs = [llm_tokens(loaded, text) for text in (args.text or [SHORT, FULL_TEXT]) for _ in range(args.repeat)]
    print(json.dumps({"model_dir": args.model_dir, "load_s": round(load_s, 1), "rss_before_mb": rss0 >> 20,
                      "rss_loaded_mb": rss >> 20, "tiny_marker": loaded.tiny, "threads": args.threads, "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
