"""What ``/metrics`` reads at scrape time from the native heap (``app/heap.py``): what an operator needs to
see memory creep coming (malloc's free bytes growing while its in-use bytes stay flat is fragmentation)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from app import heap
from app.heap import TrimStats


class HeapCollector:
    def __init__(self, trims: Callable[[], TrimStats | None]) -> None:
        self._trims = trims

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("process_threads", "Threads of the server process", value=threading.active_count())
        usage = heap.usage()
        if usage is not None:
            family = GaugeMetricFamily("process_heap_bytes", "glibc malloc's bytes: in_use by the program (mmap "
                                       "included), free (held by malloc, not in use), mmap (chunks mapped alone)",
                                       labels=["state"])
            for state, value in usage.items():
                family.add_metric([state], float(value))
            yield family
        stats = self._trims() or TrimStats()
        yield CounterMetricFamily("process_heap_trims", "malloc_trim calls (server.heap_trim_interval_s)",
                                  value=float(stats.trims))
        yield CounterMetricFamily("process_heap_trimmed_bytes", "RSS bytes malloc_trim gave back to the kernel",
                                  value=float(stats.released_bytes))
        yield CounterMetricFamily("process_heap_trim_seconds", "Seconds spent in malloc_trim (a worker thread)",
                                  value=stats.seconds)
