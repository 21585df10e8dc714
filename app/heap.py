"""The native heap (glibc malloc): few arenas, free pages given back, and its numbers for ``/metrics``.

Measured (``python -m bench serve --scenario soak``, docs/memory.md): under mixed traffic the
server's RSS grew with glibc's *free* bytes, not with what it used: after 2, 4 and 6 minutes the
arenas held 422, 458, 462 MB in use and 386, 427, 492 MB free, in 16 arenas (glibc makes up to 8
per core, one per thread that allocates while others hold theirs: slot, flow, ONNX Runtime and
executor threads). Memory a request frees (tensors, audio buffers, ONNX Runtime's per-call
buffers) goes back to its thread's arena, where a later request of another size cannot always
reuse it, and glibc returns an arena's pages to the kernel only from the top of its heap.

So, at start (:func:`configure`, before any thread exists): at most ``ARENAS`` arenas
(``M_ARENA_MAX``; an operator's own ``MALLOC_ARENA_MAX`` wins), so freed memory is shared between
threads instead of parked in one of sixteen. While serving (:class:`HeapTrimmer`), ``malloc_trim(0)`` every ``server.heap_trim_interval_s``, in a
thread, which gives every whole free page inside every arena back to the kernel (``madvise``),
not only the top of each heap.

torch's CPU convolutions go through oneDNN by way of ideep, which keeps a primitive descriptor per
input shape in a cache *per thread*, 1,024 entries by default. Every request brings new lengths, so
each thread that runs a convolution fills its own over hours (44 MB in one thread of tiny HiFT after
300 lengths; ~0.8 MB per length at full size). :func:`configure` caps it at ``SHAPE_CACHE`` entries
(``LRU_CACHE_CAPACITY``, read by torch, so it is set before torch is imported; an operator's own
value wins). A descriptor is cheap to make again (HiFT at recurring lengths ran as fast with 64 or 1
entry as with 1,024, docs/memory.md); oneDNN's compiled kernels stay in their own cache, which is
one per process and bounded.

Off glibc (musl, macOS) every malloc function here does nothing and :func:`usage` is None.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import platform
import time
from dataclasses import dataclass

log = logging.getLogger("cosyserve.heap")

M_ARENA_MAX = -8  # mallopt parameter (glibc malloc.h)
ARENAS = 2
SHAPE_CACHE, SHAPE_CACHE_ENV = 64, "LRU_CACHE_CAPACITY"  # ideep's primitive descriptors, per thread


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2  # glibc 2.33+
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()


def configure() -> str:
    """Cap the arenas and torch's per-thread shape caches (call first thing, before threads start and
    before torch is imported); what was done, for the log. ``MALLOC_ARENA_MAX`` and
    ``LRU_CACHE_CAPACITY`` in the environment win."""
    return f"{_cap_arenas()}; {_cap_shape_caches()}"


def _cap_shape_caches() -> str:
    if os.environ.get(SHAPE_CACHE_ENV):
        return f"{SHAPE_CACHE_ENV}={os.environ[SHAPE_CACHE_ENV]} from the environment"
    os.environ[SHAPE_CACHE_ENV] = str(SHAPE_CACHE)
    return f"torch's shape caches at {SHAPE_CACHE} entries a thread"


def _cap_arenas() -> str:
    if _LIBC is None:
        return "not glibc: allocator left as it is"
    if os.environ.get("MALLOC_ARENA_MAX"):
        return f"MALLOC_ARENA_MAX={os.environ['MALLOC_ARENA_MAX']} from the environment"
    if not _LIBC.mallopt(M_ARENA_MAX, ARENAS):
        return "mallopt(M_ARENA_MAX) refused: allocator left as it is"
    return f"at most {ARENAS} malloc arenas"


def usage() -> dict[str, int] | None:
    """The heap's bytes: ``in_use`` (by the program, mmapped chunks included), ``free`` (held by malloc,
    not in use: fragmentation when it grows), ``mmap`` (large chunks mapped on their own)."""
    if _LIBC is None:
        return None
    m = _LIBC.mallinfo2()
    return {"in_use": m.uordblks + m.hblkhd, "free": m.fordblks, "mmap": m.hblkhd}


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def trim() -> int:
    """``malloc_trim(0)``: free pages back to the kernel; the RSS bytes it gave back (0 off glibc)."""
    if _LIBC is None:
        return 0
    before = _rss()
    _LIBC.malloc_trim(0)
    return max(0, before - _rss())


@dataclass
class TrimStats:
    trims: int = 0
    released_bytes: int = 0
    seconds: float = 0.0


class HeapTrimmer:
    """Trims the heap every ``interval_s`` in a worker thread while the server runs (0: never)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.stats = TrimStats()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.interval_s > 0 and _LIBC is not None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            t0 = time.perf_counter()
            released = await asyncio.to_thread(trim)
            self.stats.trims += 1
            self.stats.released_bytes += released
            self.stats.seconds += time.perf_counter() - t0
            log.debug("heap trim: %.1f MB back to the kernel in %.1f ms", released / 2**20,
                      (time.perf_counter() - t0) * 1000)
