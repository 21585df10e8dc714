"""``PoolConfig``: the engine pool's settings, validated (the lifespan builds it from ``Settings.pool``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PoolConfig:
    workers: int = 2
    max_queue: int = 8  # waiting requests beyond the running ones
    queue_timeout_s: float = 30.0
    request_timeout_s: float = 300.0  # 0 = no deadline
    share_engine: bool = False  # one engine instance shared by all slots
    stream_buffer_chunks: int = 1 << 16  # items buffered between slot thread and consumer (a safety bound)
    stream_buffer_bytes: int = 32 << 20  # ... and the encoded bytes one stream may hold (a long answer fits)
    stream_buffer_total_bytes: int = 512 << 20  # ... and all streams together (app/serving/buffers.py)
    health_timeout_s: float = 5.0  # check_health() gives up (and fails) after this long
    stuck_grace_s: float = 30.0  # a job past request_timeout_s + this, still in the engine, is stuck
    close_timeout_s: float = 30.0  # close(): how long to wait for slot threads to return
    admission: str = "fixed"  # fixed: workers + max_queue at once | adaptive: a limit that follows latency
    admission_budget_s: float | None = None  # adaptive: target latency of an average request (None: automatic)
    admission_tolerance: float = 2.5  # adaptive, automatic target: this many unloaded latencies
    bulk_max_queue: int = 1000  # bulk requests waiting for spare room (app/serving/bulk.py); beyond -> 503
    bulk_queue_timeout_s: float = 3600.0  # a bulk request waiting longer for room gets 503

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if self.max_queue < 0:
            raise ValueError("max_queue must be 0 or more")
        if self.queue_timeout_s <= 0:
            raise ValueError("queue_timeout_s must be positive")
        if self.request_timeout_s < 0:
            raise ValueError("request_timeout_s must be 0 (no deadline) or positive")
        if self.stream_buffer_chunks < 1:
            raise ValueError("stream_buffer_chunks must be at least 1")
        if self.stream_buffer_bytes < 1 or self.stream_buffer_total_bytes < 1:
            raise ValueError("stream_buffer_bytes and stream_buffer_total_bytes must be at least 1")
        if self.health_timeout_s <= 0 or self.stuck_grace_s < 0:
            raise ValueError("health_timeout_s must be positive and stuck_grace_s 0 or more")
        if self.admission not in ("fixed", "adaptive"):
            raise ValueError("admission must be 'fixed' or 'adaptive'")
        if self.admission_budget_s is not None and self.admission_budget_s <= 0:
            raise ValueError("admission_budget_s must be positive (or None: automatic)")
        if self.admission_tolerance <= 1:
            raise ValueError("admission_tolerance must be above 1")
        if self.bulk_max_queue < 0 or self.bulk_queue_timeout_s <= 0:
            raise ValueError("bulk_max_queue must be 0 or more and bulk_queue_timeout_s positive")

    @property
    def ceiling(self) -> int:
        """The most requests admitted at once, in either mode."""
        return self.workers + self.max_queue
