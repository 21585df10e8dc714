"""``/metrics`` for the edge: bodies being read, refusals held, audio buffered for clients.

Read at scrape time from the objects that own the numbers (the ``BodyGate``,
the ``RefusalPacer``, the pool's ``StreamBudget``), so the request path only
moves integers. Registered by ``create_app`` on the app's own registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from app.api.bodies import BodyGate
from app.api.refusals import RefusalPacer

BODY_REFUSALS = ("too_large", "timeout", "busy")


class EdgeCollector:
    def __init__(self, bodies: BodyGate, pacer: RefusalPacer, streams: Callable[[], dict | None]) -> None:
        self.bodies = bodies
        self.pacer = pacer
        self.streams = streams  # the pool's stream budget snapshot (None before the pool exists)

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        b = self.bodies
        yield GaugeMetricFamily("tts_body_reads", "Request bodies being read now (no permit held; "
                                "server.max_body_reads)", value=float(b.reading))
        yield GaugeMetricFamily("tts_body_buffered_bytes", "Bytes held by the request bodies being read "
                                "(server.body_buffer_mb)", value=float(b.buffered))
        yield GaugeMetricFamily("tts_body_buffer_limit_bytes", "Most bytes the request bodies being read may "
                                "hold together", value=float(b.limits.max_buffered_bytes))
        refused = CounterMetricFamily("tts_body_refused", "Request bodies refused while reading: too_large (413), "
                                      "timeout (408), busy (503: too many bodies being read)", labels=["reason"])
        for reason in BODY_REFUSALS:
            refused.add_metric([reason], float(b.refused.get(reason, 0)))
        yield refused
        p = self.pacer
        yield GaugeMetricFamily("tts_refusals_holding", "503s being held because refusals exceed "
                                "server.refusals_per_s (a retry storm)", value=float(p.held))
        yield CounterMetricFamily("tts_refusals_held", "503s that were held before they were sent",
                                  value=float(p.held_total))
        yield CounterMetricFamily("tts_refusal_hold_seconds", "Seconds 503s were held in all",
                                  value=float(p.held_s_total))
        s = self.streams() or {}
        yield GaugeMetricFamily("tts_stream_buffered_bytes", "Audio produced and not yet read by streaming "
                                "clients, all streams (pool.stream_buffer_total_mb)", value=float(s.get("used", 0)))
        yield GaugeMetricFamily("tts_stream_buffer_limit_bytes", "Most unread audio all streams may buffer "
                                "together", value=float(s.get("limit", 0)))
        yield GaugeMetricFamily("tts_stream_buffer_peak_bytes", "The most unread audio ever buffered at once",
                                value=float(s.get("peak", 0)))
        yield CounterMetricFamily("tts_stream_buffer_full_waits", "Times a stream's producer waited because all "
                                  "streams' buffers were full", value=float(s.get("waits", 0)))
        yield CounterMetricFamily("tts_streams_stalled", "Streams closed because their client read nothing for "
                                  "server.send_timeout_s", value=float(s.get("stalled", 0)))
