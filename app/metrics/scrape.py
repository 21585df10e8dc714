"""What ``/metrics`` reads at scrape time from the pool's ``stats()``: slots, requests in flight, the
admission gate's state, the traffic classes; the process' peak RSS."""

from __future__ import annotations

import logging
import resource
import sys
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from app.serving.admission.classes import NAMES as PRIORITIES

log = logging.getLogger("cosyserve.metrics")

SLOT_STATES: tuple[str, ...] = ("loading", "idle", "busy", "failed", "closed")


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


class PoolCollector:
    """Values read at scrape time: slot states and in-flight requests from the pool, peak RSS."""

    def __init__(self, stats: Callable[[], dict | None]) -> None:
        self._stats = stats

    def describe(self) -> Iterable[Metric]:
        return []  # no describe-time collection (the pool may not exist yet)

    def collect(self) -> Iterator[Metric]:
        slots = GaugeMetricFamily("tts_slots", "Engine slots by state", labels=["state"])
        inflight = GaugeMetricFamily("tts_inflight_requests",
                                     "Admitted synthesis requests: queued, running or still streaming")
        counts = dict.fromkeys(SLOT_STATES, 0)
        stats = None
        try:
            stats = self._stats()
        except Exception:  # a scrape must not fail because the pool is in a strange state
            log.exception("reading pool stats for /metrics failed")
        if stats:
            for slot in stats.get("slots", ()):
                state = slot.get("state", "")
                if state in counts:
                    counts[state] += 1
        for state, n in counts.items():
            slots.add_metric([state], n)
        classes = (stats or {}).get("classes") or {}
        bulk_out = (classes.get("bulk") or {}).get("in_flight", 0)
        inflight.add_metric([], float(stats.get("in_flight", 0) + bulk_out) if stats else 0.0)
        yield slots
        yield inflight
        yield GaugeMetricFamily("tts_slots_stuck", "Slots stuck in the engine past request_timeout_s + "
                                "stuck_grace_s (/health/live fails while any is)",
                                value=float(stats.get("stuck", 0)) if stats else 0.0)
        yield CounterMetricFamily("tts_stuck_jobs", "Jobs found stuck in the engine since start",
                                  value=float(stats.get("stuck_total", 0)) if stats else 0.0)
        yield GaugeMetricFamily("tts_process_peak_rss_bytes", "Peak resident set size of this process",
                                value=_peak_rss_bytes())
        yield from _admission_metrics((stats or {}).get("admission") or {})
        yield from _class_metrics(classes)


def _class_metrics(classes: dict) -> Iterator[Metric]:
    """Per traffic class (issue 39): waiting, running, completed; the bulk room and its leavers."""
    queued = GaugeMetricFamily("tts_class_queue_depth", "Requests waiting, per traffic class (interactive: "
                               "admitted, waiting for a slot; bulk: in the bulk queue, waiting for room)",
                               labels=["priority"])
    running = GaugeMetricFamily("tts_class_running", "Requests holding an engine slot (or still being "
                                "consumed), per traffic class", labels=["priority"])
    completed = CounterMetricFamily("tts_class_completed", "Engine jobs that ended ok, per traffic class "
                                    "(its rate: the class' throughput)", labels=["priority"])
    for name in PRIORITIES:
        c = classes.get(name) or {}
        queued.add_metric([name], float(c.get("queued", 0)))
        running.add_metric([name], float(c.get("running", 0)))
        completed.add_metric([name], float(c.get("completed", 0)))
    yield queued
    yield running
    yield completed
    bulk = classes.get("bulk") or {}
    yield GaugeMetricFamily("tts_bulk_room", "Bulk requests that may run now: the admission limit (at most the "
                            "workers) minus the interactive load", value=float(bulk.get("room", 0)))
    yield CounterMetricFamily("tts_bulk_left", "Bulk requests whose client left while they waited in the bulk "
                              "queue", value=float(bulk.get("left", 0)))


def _admission_metrics(adm: dict) -> Iterator[Metric]:
    """The admission gate's state (pool.admission adaptive or fixed; docs/concurrency.md)."""
    limit = GaugeMetricFamily("tts_admission_limit", "Requests (of average size) admitted at once now: the "
                              "adaptive limit, or workers + max_queue when fixed", labels=["mode"])
    if adm.get("mode"):
        limit.add_metric([adm["mode"]], float(adm.get("limit", 0)))
    yield limit
    yield GaugeMetricFamily("tts_admission_ceiling", "Most requests ever admitted at once (pool.workers + "
                            "pool.max_queue)", value=float(adm.get("ceiling", 0)))
    yield GaugeMetricFamily("tts_admission_load", "Admitted requests in flight, weighted by their size "
                            "(1 = an average request)", value=float(adm.get("load", 0.0)))
    yield GaugeMetricFamily("tts_admission_lanes", "Long jobs running in lanes beside the limit (a slot each, "
                            "none of the limit's load)", value=float(adm.get("lanes", 0)))
    yield CounterMetricFamily("tts_admission_lane_paused_seconds", "Seconds ended long jobs in lanes paused "
                              "to leave the cores to short requests in flight", value=float(adm.get("lane_paused_s", 0)))
    yield GaugeMetricFamily("tts_admission_predicted_wait_seconds", "How long a request arriving now would "
                            "wait before it could start (0: at once; else it is refused with this Retry-After)",
                            value=float(adm.get("predicted_wait_s") or 0.0))
    for name, key, text in (
            ("tts_admission_target_latency_seconds", "target_s",
             "Adaptive: the latency budget of an average request (pool.admission_budget_s, or "
             "pool.admission_tolerance x the unloaded latency)"),
            ("tts_admission_unloaded_latency_seconds", "unloaded_s",
             "Adaptive: the latency of an average request that ran alone (median of recent ones)")):
        if adm.get(key) is not None:
            yield GaugeMetricFamily(name, text, value=float(adm[key]))
