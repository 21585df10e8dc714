"""app.heap: the arena and shape-cache caps, the heap's numbers and the trimmer (glibc; this project's machines and images)."""

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


def _run(code: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PATH": "", **env}).stdout.strip()


def test_configure_caps_the_arenas_and_shape_caches_unless_the_environment_says_otherwise():
    code = "from app import heap; print(heap.configure())"
    assert _run(code) == f"at most {heap.ARENAS} malloc arenas; torch's shape caches at {heap.SHAPE_CACHE} entries a thread"
    assert _run(code, MALLOC_ARENA_MAX="4", LRU_CACHE_CAPACITY="1024") == (
        "MALLOC_ARENA_MAX=4 from the environment; LRU_CACHE_CAPACITY=1024 from the environment")


# 400 input lengths through 4 convolutions in one thread: in use after the first 30 and after all, with
# oneDNN's compiled-kernel cache off so that only ideep's per-thread descriptor cache can hold anything
CONVS = """
from app import heap
print(heap.configure())
import torch
torch.set_num_threads(1)
convs = [torch.nn.Conv1d(64, 64, k, padding=k // 2) for k in (3, 5, 7, 9)]
def run(n):
    with torch.inference_mode():
        x = torch.randn(1, 64, 8 * n)
        for c in convs:
            x = c(x)
for n in range(50, 80): run(n)
heap.trim(); before = heap.usage()["in_use"]
for n in range(80, 480): run(n)
heap.trim(); print((heap.usage()["in_use"] - before) / 2**20)
"""


def test_torch_keeps_a_bounded_number_of_shapes_a_thread():
    capped = _run(CONVS, ONEDNN_PRIMITIVE_CACHE_CAPACITY="0").splitlines()
    assert "shape caches at 64" in capped[0]
    default = _run(CONVS, ONEDNN_PRIMITIVE_CACHE_CAPACITY="0", LRU_CACHE_CAPACITY="1024").splitlines()
    assert "LRU_CACHE_CAPACITY=1024 from the environment" in default[0]
    # torch's default keeps 1,024 descriptors (~20 kB each here); the cap keeps 64 of them
    assert float(default[1]) > 8 and float(capped[1]) < 2, (default, capped)


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
