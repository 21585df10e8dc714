"""``PoolConfig``: what the engine pool runs with, built from ``Settings.pool`` by
``app/settings/runtime.py`` (its defaults and checks are the settings'; none here)."""

from __future__ import annotations

from dataclasses import dataclass

from app.serving.admission.limit.adaptive import AdaptiveConfig


@dataclass
class PoolConfig:
    workers: int  # engine slots
    max_queue: int  # waiting requests beyond the running ones (pool.max_queue, resolved)
    queue_timeout_s: float
    request_timeout_s: float  # 0 = no deadline
    share_engine: bool  # one engine instance shared by all slots
    stream_buffer_chunks: int  # items buffered between slot thread and consumer (a safety bound)
    stream_buffer_bytes: int  # ... and the encoded bytes one stream may hold (a long answer fits)
    stream_buffer_total_bytes: int  # ... and all streams together (app/serving/buffers.py)
    health_timeout_s: float  # check_health() gives up (and fails) after this long
    stuck_grace_s: float  # a job past request_timeout_s + this, still in the engine, is stuck
    close_timeout_s: float  # close(): how long to wait for slot threads to return
    adaptive: AdaptiveConfig | None  # None: fixed admission, workers + max_queue at once
    bulk_max_queue: int  # bulk requests waiting for spare room (app/serving/admission/bulk.py); beyond -> 503
    bulk_queue_timeout_s: float  # a bulk request waiting longer for room gets 503

    @property
    def ceiling(self) -> int:
        """The most requests admitted at once, in either mode."""
        return self.workers + self.max_queue
