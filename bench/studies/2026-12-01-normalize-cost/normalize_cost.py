"""What text normalization costs: ``python -m bench.studies.2026-12-01-normalize-cost.normalize_cost [--repeat N]``.

Prints the one-off FST load time and, per language mix, milliseconds per 100 input
characters of ``TextNormalizer.normalize`` (wetext, one thread; the engine runs it in
its slot thread, so this is CPU time a request spends before its first LLM step).
"""

from __future__ import annotations

import argparse
import statistics
import time

from app.text.normalize import TextNormalizer

TEXTS = {
    "en-numbers": "I bought 5 apples for $3.50 at 10:30 am on Jan 5, 2024. Prices rose 20% and the store is 3 km away. ",
    "en-plain": "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the quiet green hills. ",
    "zh-numbers": "我在2026年12月1日买了3公斤苹果，一共花了¥120。今天的气温是25度，湿度是60%，风速每小时15公里。",
    "zh-plain": "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐，笑容如花儿般绽放。",
}


def measure(norm: TextNormalizer, text: str, repeat: int) -> float:
    """Median ms per 100 characters over ``repeat`` runs."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        norm.normalize(text)
        runs.append((time.perf_counter() - t0) * 1000 * 100 / len(text))
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--chars", type=int, default=1000, help="input length per run")
    args = ap.parse_args()
    t0 = time.perf_counter()
    norm = TextNormalizer("auto")
    norm.load()
    print(f"load (import wetext + read zh/en/ja FSTs, once per process): {time.perf_counter() - t0:.2f} s")
    texts = dict(TEXTS)
    texts["mixed"] = TEXTS["en-numbers"] + TEXTS["zh-numbers"] + TEXTS["en-plain"] + TEXTS["zh-plain"]
    print(f"{'text':<12} {'chars':>6} {'ms/100 chars':>13}")
    for name, unit in texts.items():
        text = (unit * (args.chars // len(unit) + 1))[: args.chars]
        print(f"{name:<12} {len(text):>6} {measure(norm, text, args.repeat):>13.2f}")
    print(f"command: python -m bench.studies.2026-12-01-normalize-cost.normalize_cost --repeat {args.repeat} --chars {args.chars}")


if __name__ == "__main__":
    main()
