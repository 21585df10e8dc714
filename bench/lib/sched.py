"""Keep the load generator's timings its own: real-time scheduling for the client process.

On one machine the servers' compute threads keep every core busy, and a load generator in the
normal class is preempted by them: its requests then wait for a CPU, not for the server. Measured
on 2 cores at 3x overload (tiny v2, 30 s): the load generator used 7 % of a core, was preempted
~1,300 times, and the 503s it timed had a p99 of 17-25 ms; in ``SCHED_FIFO`` it was preempted
0-1 times and the same 503s took 7 ms (a raw-socket probe in its own process saw 5-6 ms, the
server's access log 2 ms). A real deployment's clients are on other machines.

``SCHED_RESET_ON_FORK`` makes the servers it starts (and any child) run in the normal class, so
only the client itself is real-time; it uses a few percent of a core, and the kernel's real-time
throttling bounds it anyway. Without the privilege (``CAP_SYS_NICE``, e.g. a container's default)
nothing changes and the report says so.
"""

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
