"""Compute threads run below the event loop.

Synthesis keeps every core busy; the event loop that answers 503s, health probes, `/metrics`
and stream writes needs a core for a moment, often. At the same priority it waits for a
compute thread's time slice; with the compute threads a few steps nicer it preempts them at
once. Measured on 2 cores at 3x overload (tiny v2, 30 s open loop, a real-time load generator,
six pairs): the 503s' p99 fell from 8.8-13.7 ms to 6.2-8.0 ms, throughput unchanged
(docs/concurrency.md).

Linux gives every thread its own nice value (``setpriority`` on a thread id), and raising one's
own needs no privilege, so this works in any container. Elsewhere it does nothing. The lifespan
sets the offset (``pool.compute_nice``) before any engine loads; every compute thread (the slot
executors, the LLM and flow schedulers) calls ``lower_this_thread()`` as it starts. The offset
counts from the process's main thread (the event loop's), whichever thread starts the compute
thread, so one started by another compute thread is not lowered twice.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

log = logging.getLogger("cosyserve")

MAX_NICE = 19
PR_SET_NAME = 15  # prctl(2)
_offset = 0


def set_offset(nice: int) -> None:
    """How much nicer than the thread that starts them compute threads run (0: as nice as it)."""
    global _offset
    _offset = max(0, min(MAX_NICE, int(nice)))


def offset() -> int:
    return _offset


def supported() -> bool:
    """Threads have nice values of their own here (Linux)."""
    return sys.platform.startswith("linux")


def name_os_thread() -> None:
    """Give the calling thread its Python name in the kernel too (``top -H``, ``ps -L``, py-spy, /proc), without
    the ``cosyserve-`` prefix: Linux keeps 15 bytes. Elsewhere, or where it fails, nothing."""
    if not supported():
        return
    name = threading.current_thread().name.removeprefix("cosyserve-").encode()[:15]
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl in this libc: keep the inherited name
        pass


def lower_this_thread() -> int | None:
    """Run the calling thread ``offset()`` nicer than the main thread (only ever lowering it: raising a
    priority needs a privilege) and name it for the kernel (``name_os_thread``); returns its nice value
    after, or None when off or not possible."""
    name_os_thread()
    if _offset <= 0 or not supported():
        return None
    tid = threading.get_native_id()
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread's (Linux: its id is the pid)
        now = os.getpriority(os.PRIO_PROCESS, tid)
        target = min(MAX_NICE, base + _offset)
        if target > now:
            os.setpriority(os.PRIO_PROCESS, tid, target)
        return max(now, target)
    except OSError as exc:  # a seccomp profile that forbids it: run as is
        log.debug("could not lower compute thread %s: %s", threading.current_thread().name, exc)
        return None
