"""Prometheus text -> sample values, through prometheus_client's own parser."""

from __future__ import annotations

import math

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(base: str, labels: bool = False, timeout: float = 10) -> dict[str, float]:
    """The samples of ``BASE/metrics`` (``parse_samples``)."""
    return parse_samples(httpx.get(base + "/metrics", timeout=timeout).text, labels)


async def ascrape(client: httpx.AsyncClient) -> dict[str, float]:
    """The samples of the ``/metrics`` of ``client``'s base URL."""
    return parse_samples((await client.get("/metrics", timeout=5)).text)


def parse_samples(text: str, labels: bool = False) -> dict[str, float]:
    """``{sample name: value summed over its label sets}``; ``labels``: one entry per label set instead, named as
    the server writes it (``tts_cache_bytes{tier="memory"}``). NaN samples are left out."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if math.isnan(s.value):
                continue
            shown = ",".join(f'{k}="{_escaped(v)}"' for k, v in s.labels.items())
            key = f"{s.name}{{{shown}}}" if labels and shown else s.name
            out[key] = out.get(key, 0.0) + s.value
    return out


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
