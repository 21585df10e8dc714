"""app.heap: the arena cap, the heap's numbers and the trimmer (glibc; this project's machines and images)."""

from __future__ import annotations

import asyncio
import ctypes
import subprocess
import sys

import pytest

from app import heap

pytestmark = pytest.mark.skipif(heap.usage() is None, reason="glibc only (every image and CI machine is glibc)")


def test_usage_counts_what_the_program_holds_and_frees():
    before = heap.usage()
    assert set(before) == {"in_use", "free", "mmap"} and before["in_use"] > 0
    blocks = [ctypes.create_string_buffer(64 * 1024) for _ in range(200)]  # 12.5 MB from malloc
    held = heap.usage()
    assert held["in_use"] >= before["in_use"] + 10 * 2**20
    del blocks


def test_trim_gives_free_pages_back_to_the_kernel():
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # small blocks, freed except a few pinned ones: the heap cannot shrink from its top, only trim helps
    blocks = [libc.malloc(4096) for _ in range(20_000)]
    for i, b in enumerate(blocks):
        if i % 500:
            libc.free(b)
    ctypes.memset(libc.malloc(16), 0, 16)
    assert heap.trim() > 10 * 2**20  # ~80 MB were freed inside the heap
    for i, b in enumerate(blocks):
        if not i % 500:
            libc.free(b)


def test_configure_caps_the_arenas_unless_the_environment_says_otherwise():
    code = "from app import heap; print(heap.configure())"
    capped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert capped.strip() == f"at most {heap.ARENAS} malloc arenas"
    env = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"MALLOC_ARENA_MAX": "4", "PATH": ""}).stdout
    assert env.strip() == "MALLOC_ARENA_MAX=4 from the environment"


def test_the_trimmer_trims_on_its_interval_and_stops():
    async def main() -> heap.TrimStats:
        trimmer = heap.HeapTrimmer(0.01)
        trimmer.start()
        await asyncio.sleep(0.2)
        await trimmer.stop()
        return trimmer.stats

    stats = asyncio.run(main())
    assert stats.trims >= 3 and stats.seconds > 0
    off = heap.HeapTrimmer(0)
    off.start()
    assert off._task is None
