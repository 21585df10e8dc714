"""``PoolObserver``: how the metrics layer (``app/metrics/``) learns what the pool does without the
pool importing it; the reasons and outcomes it reports."""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)

REJECT_REASONS: tuple[str, ...] = ("queue_full", "over_budget", "queue_timeout", "draining", "not_ready",
                                   "bulk_queue_full", "bulk_timeout")
JOB_OUTCOMES: tuple[str, ...] = ("ok", "cancelled", "error", "timeout")


@runtime_checkable
class PoolObserver(Protocol):
    """Optional hooks, all called on the event loop thread; they must not block."""

    def on_reject(self, reason: str) -> None: ...  # one of REJECT_REASONS

    def on_queue_wait(self, seconds: float) -> None: ...

    def on_job_start(self) -> None: ...

    def on_job_end(self, outcome: str, seconds: float) -> None: ...  # one of JOB_OUTCOMES

    def on_queue_depth(self, depth: int) -> None: ...

    def on_class_wait(self, priority: str, seconds: float) -> None: ...  # admission (bulk: its queue) to a slot


class NullObserver:
    """The default observer: does nothing."""

    def on_reject(self, reason: str) -> None:
        pass

    def on_queue_wait(self, seconds: float) -> None:
        pass

    def on_job_start(self) -> None:
        pass

    def on_job_end(self, outcome: str, seconds: float) -> None:
        pass

    def on_queue_depth(self, depth: int) -> None:
        pass

    def on_class_wait(self, priority: str, seconds: float) -> None:
        pass


class SafeObserver:
    """Forwards to an observer; a failing hook is logged, never allowed to break serving."""

    def __init__(self, inner: PoolObserver) -> None:
        self._inner = inner

    def _call(self, name: str, *args: object) -> None:
        try:
            hook = getattr(self._inner, name, None)
            if hook is None:
                return  # an observer written before this hook existed
            hook(*args)
        except Exception:  # a metrics bug must not fail a request or leak a slot
            log.exception("pool observer hook %s failed", name)

    def on_reject(self, reason: str) -> None:
        self._call("on_reject", reason)

    def on_queue_wait(self, seconds: float) -> None:
        self._call("on_queue_wait", seconds)

    def on_job_start(self) -> None:
        self._call("on_job_start")

    def on_job_end(self, outcome: str, seconds: float) -> None:
        self._call("on_job_end", outcome, seconds)

    def on_queue_depth(self, depth: int) -> None:
        self._call("on_queue_depth", depth)

    def on_class_wait(self, priority: str, seconds: float) -> None:
        self._call("on_class_wait", priority, seconds)
