"""What ``/metrics`` reads at scrape time from the answer cache's ``stats()`` (app/serving/answers/)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("cosyserve.metrics")

TIERS: tuple[str, ...] = ("memory", "disk")


class CacheCollector:
    """The answer cache's lookups, bytes, budgets and evictions (all zero while it is off or not built)."""

    def __init__(self, stats: Callable[[], dict | None]) -> None:
        self._stats = stats

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            s = self._stats() or {}
        except Exception:  # a scrape must not fail because of the cache
            log.exception("reading answer-cache stats for /metrics failed")
            s = {}
        lookups = CounterMetricFamily("tts_cache_lookups", "Answer-cache lookups of reproducible (seeded) requests: "
                                      "result hit (by tier) or miss (computed)", labels=["result", "tier"])
        for tier in TIERS:
            lookups.add_metric(["hit", tier], float((s.get("hits") or {}).get(tier, 0)))
        lookups.add_metric(["miss", ""], float(s.get("misses", 0)))
        yield lookups
        for name, key, text in (
                ("tts_cache_bytes", "bytes", "Bytes the answer cache holds, by tier"),
                ("tts_cache_budget_bytes", "budget", "The answer cache's budget by tier (0: tier off)")):
            family = GaugeMetricFamily(name, text, labels=["tier"])
            for tier in TIERS:
                family.add_metric([tier], float((s.get(key) or {}).get(tier, 0)))
            yield family
        evictions = CounterMetricFamily("tts_cache_evictions", "Answers evicted to stay within a budget, by tier",
                                        labels=["tier"])
        for tier in TIERS:
            evictions.add_metric([tier], float((s.get("evictions") or {}).get(tier, 0)))
        yield evictions
        yield GaugeMetricFamily("tts_cache_entries", "Answers in the memory tier", value=float(s.get("entries", 0)))
        yield CounterMetricFamily("tts_cache_stores", "Answers stored", value=float(s.get("stores", 0)))
        yield CounterMetricFamily("tts_cache_too_large", "Answers sent but not stored: over cache.max_entry_mb",
                                  value=float(s.get("too_large", 0)))
        yield CounterMetricFamily("tts_cache_waits", "Requests that waited for an identical one being computed "
                                  "instead of computing it again", value=float(s.get("waits", 0)))
        yield CounterMetricFamily("tts_cache_corrupt", "Cache files found damaged or foreign (removed; answered as "
                                  "a miss)", value=float(s.get("corrupt", 0)))
