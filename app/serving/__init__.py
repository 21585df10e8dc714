"""Concurrency core: admission, engine slots, jobs, streaming, the speech service. No web or model imports."""

from app.serving.admission import PermitError, Ticket
from app.serving.config import PoolConfig
from app.serving.errors import (
    DeadlineExceeded,
    Draining,
    NotReady,
    Overloaded,
    QueueTimeout,
    ServingError,
)
from app.serving.job import Job
from app.serving.observer import NullObserver, PoolObserver
from app.serving.pool import EnginePool

__all__ = [
    "DeadlineExceeded",
    "Draining",
    "EnginePool",
    "Job",
    "NotReady",
    "NullObserver",
    "Overloaded",
    "PermitError",
    "PoolConfig",
    "PoolObserver",
    "QueueTimeout",
    "ServingError",
    "Ticket",
]
