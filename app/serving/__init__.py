"""Concurrency core: engine slots, admission, leases, streaming. No web or model imports."""

from app.serving.errors import (
    DeadlineExceeded,
    Draining,
    NotReady,
    Overloaded,
    QueueTimeout,
    ServingError,
)
from app.serving.pool import EnginePool, Job, Lease, PoolConfig, Ticket
from app.serving.stats import NullObserver, PoolObserver

__all__ = [
    "DeadlineExceeded",
    "Draining",
    "EnginePool",
    "Job",
    "Lease",
    "NotReady",
    "NullObserver",
    "Overloaded",
    "PoolConfig",
    "PoolObserver",
    "QueueTimeout",
    "ServingError",
    "Ticket",
]
