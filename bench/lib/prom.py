"""Prometheus text -> sample values."""

from __future__ import annotations

import math

import httpx


def scrape(base: str, labels: bool = False, timeout: float = 10) -> dict[str, float]:
    """The samples of ``BASE/metrics`` (``parse_samples``)."""
    return parse_samples(httpx.get(base + "/metrics", timeout=timeout).text, labels)


async def ascrape(client: httpx.AsyncClient) -> dict[str, float]:
    """The samples of the ``/metrics`` of ``client``'s base URL."""
    return parse_samples((await client.get("/metrics", timeout=5)).text)


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
