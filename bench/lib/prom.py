"""Prometheus text -> sample values, and the LLM engine metrics' deltas over a benchmark point.

The batched LLM's metrics (``tts_llm_tokens_total``, the ``tts_llm_batch_size`` and
``tts_llm_step_seconds`` histograms) may not exist on every server: a metric that is
absent before or after a point gives ``None``, never 0.
"""

from __future__ import annotations

import math

TOKENS = "tts_llm_tokens_total"
BATCH = "tts_llm_batch_size"
STEP = "tts_llm_step_seconds"


def parse_samples(text: str, labels: bool = False) -> dict[str, float]:
    """``{sample name: value summed over its label sets}`` from Prometheus text exposition; ``labels``: one
    entry per label set instead, named as written (``tts_cache_bytes{tier="memory"}``)."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            close = _label_end(rest)
            if close < 0:
                continue
            fields = rest[close + 1 :].split()
            key = f"{name}{{{rest[:close]}}}" if labels else name
        else:
            name, *fields = line.split()
            key = name
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[key] = out.get(key, 0.0) + value
    return out


def _label_end(rest: str) -> int:
    """Index of the ``}`` closing a label set (label values may contain escaped quotes and braces)."""
    quoted = escaped = False
    for i, ch in enumerate(rest):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "}" and not quoted:
            return i
    return -1


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    if name not in before or name not in after:
        return None
    return after[name] - before[name]


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def llm_deltas(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float | None]:
    """Speech tokens/s over the point, mean LLM batch size, mean step time, tokens per LLM-step second.

    A counter that did not exist before the point but does after (created on first use)
    counts from 0.
    """
    before = dict(before)
    for name in (TOKENS, f"{BATCH}_sum", f"{BATCH}_count", f"{STEP}_sum", f"{STEP}_count"):
        if name in after and name not in before:
            before[name] = 0.0
    tokens = _delta(before, after, TOKENS)
    step_sum = _delta(before, after, f"{STEP}_sum")
    return {
        "llm_tokens": tokens,
        "llm_tokens_per_s": _ratio(tokens, wall_s),
        "llm_batch_mean": _ratio(_delta(before, after, f"{BATCH}_sum"), _delta(before, after, f"{BATCH}_count")),
        "llm_step_mean_s": _ratio(step_sum, _delta(before, after, f"{STEP}_count")),
        "llm_steps": _delta(before, after, f"{STEP}_count"),
        "llm_tokens_per_step_s": _ratio(tokens, step_sum),
    }
