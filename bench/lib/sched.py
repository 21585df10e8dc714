"""Real-time scheduling for the load generator, so its timings are its own (bench/README.md, "The real-time
client"): the servers it starts stay in the normal class."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def realtime_client(priority: int) -> Iterator[str]:
    """Run this process in ``SCHED_FIFO`` at ``priority`` (children reset to the normal class) while the
    block runs; yields what was done, in words, for the report. ``priority`` 0: leave it as it is."""
    if priority <= 0:
        yield "normal scheduling (real-time client off)"
        return
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_RESET_ON_FORK"):
        yield "normal scheduling (no real-time scheduling on this platform)"
        return
    before = os.sched_getscheduler(0)
    before_param = os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except OSError as exc:
        yield f"normal scheduling (real-time client not permitted: {exc.strerror or exc})"
        return
    try:
        yield f"SCHED_FIFO priority {priority}, servers in SCHED_OTHER"  # what reset-on-fork gives a child
    finally:
        os.sched_setscheduler(0, before & ~os.SCHED_RESET_ON_FORK, before_param)
