"""GPU memory gauges, read at scrape time from the engine's reader (no series on a CPU server)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger("cosyserve.metrics")

GPU_MEMORY = (("allocated", "GPU memory held by live tensors"),
              ("reserved", "GPU memory held by the caching allocator (live tensors and cached free blocks)"),
              ("peak", "Peak GPU memory held by live tensors since start"))


class GpuMemoryCollector:
    """``tts_gpu_memory_{allocated,reserved,peak}_bytes{device}`` from a reader ({} on a CPU: no series)."""

    def __init__(self) -> None:
        self.reader: Callable[[], dict] | None = None

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        if self.reader is None:
            return
        try:
            devices = self.reader() or {}
        except Exception:  # a scrape must not fail on a driver hiccup
            log.exception("reading GPU memory for /metrics failed")
            return
        if not devices:
            return
        for kind, doc in GPU_MEMORY:
            family = GaugeMetricFamily(f"tts_gpu_memory_{kind}_bytes", doc, labels=["device"])
            for device, values in sorted(devices.items()):
                family.add_metric([device], float(values.get(kind, 0)))
            yield family
