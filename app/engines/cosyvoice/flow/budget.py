"""A server-wide byte budget for the streams' flow caches (``engine.flow_cache_budget_mb``).

Each streaming request with ``engine.flow_cache`` keeps the flow estimator's keys and
values of every frame it has computed (``flow_cache.FlowStream``): ~4.6 MB per frame at
full size in fp32, so a few long streams hold gigabytes. Before each hop a stream asks the
budget for what it will hold after the hop (what it holds now plus the new frames at the
estimator's bytes per frame); after the hop it settles to what it really holds. A stream
the budget cannot take drops its cache and streams on by recomputing the prefix (CosyVoice's
own way, the same frames to float rounding), counted in ``recomputed`` and reported to
``on_recompute`` (``tts_flow_cache_recomputed_streams_total`` in ``/metrics``). A stream
gives its bytes back when it ends.

Sized to the machine by default (``engine.flow_cache_budget_mb`` unset, :func:`auto_budget_bytes`):
a quarter of the memory free when the engine has loaded: on a CPU the host's available
memory, within the container's cgroup limit; on CUDA the device's free memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("cosyserve.engine")

AUTO_SHARE = 0.25  # the budget's share of the memory free at load when engine.flow_cache_budget_mb is unset
FALLBACK_BYTES = 4 << 30  # when no free-memory figure can be read
ODE_STEPS = 10  # CosyVoice2's CFM solve: every step keeps its own keys/values per frame
CFG_ROWS = 2  # classifier-free guidance runs two rows per frame


def bytes_per_frame(flow: Any, element_size: int = 4) -> int:
    """What one more cached estimator frame costs: keys + values of every attention layer, every ODE step.

    ``element_size``: bytes per stored key/value element (4 for fp32, 2 for fp16 storage,
    ``engine.flow_cache_precision``).
    """
    per_step = 0
    for module in flow.decoder.estimator.modules():
        if hasattr(module, "to_k") and hasattr(module, "to_v"):
            per_step += CFG_ROWS * (module.to_k.out_features + module.to_v.out_features)
    return per_step * ODE_STEPS * element_size


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def host_free_bytes(root: str = "/") -> int | None:
    """The host's available memory (``MemAvailable``), within the cgroup's limit less its usage (v2 or v1);
    ``root``: where ``proc`` and ``sys`` are (tests)."""
    free = None
    base = Path(root)
    try:
        for line in (base / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),
                                   ("sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(base / limit_file), _read_int(base / usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 writes a huge number for none
            room = max(0, limit - usage)
            free = room if free is None else min(free, room)
            break
    return free


def auto_budget_bytes(device: str) -> tuple[int, str]:
    """The default budget: ``AUTO_SHARE`` of the memory free now on ``device``, and how it was sized (for the log)."""
    free, where = None, "host memory available"
    if device.startswith("cuda"):
        import torch

        free, where = torch.cuda.mem_get_info(torch.device(device))[0], f"free memory of {device}"
    else:
        free = host_free_bytes()
    if free is None:
        return FALLBACK_BYTES, "no free-memory figure could be read"
    return int(free * AUTO_SHARE), f"{AUTO_SHARE:.0%} of {free / 2**30:.1f} GiB {where} at load"


def budget_mb(setting: float | None, device: str) -> float:
    """``engine.flow_cache_budget_mb``, or, unset, sized to the memory free now on ``device`` (logged)."""
    if setting is not None:
        return setting
    size, how = auto_budget_bytes(device)
    log.info("flow cache budget %.0f MB (%s; engine.flow_cache_budget_mb sets it)", size / 2**20, how)
    return size / 2**20


class FlowCacheBudget:
    """Bytes held by all streams' flow caches, at most ``max_bytes`` (thread-safe).

    ``on_usage(bytes, max_bytes, streams)`` is called after every change (the ``/metrics`` gauges)."""

    def __init__(self, max_bytes: int, per_frame: int, on_recompute: Callable[[], None] | None = None,
                 on_usage: Callable[[int, int, int], None] | None = None) -> None:
        self.max_bytes = int(max_bytes)
        self.per_frame = int(per_frame)
        self.on_recompute = on_recompute
        self.on_usage = on_usage
        self.used = 0
        self.recomputed = 0  # streams that had to recompute (refused, at their first hop or later)
        self._held: dict[int, int] = {}
        self._lock = threading.Lock()

    def need(self, held_bytes: int, frames_now: int, frames_after: int, window: int | None) -> int:
        """Bytes a stream holding ``held_bytes`` for ``frames_now`` frames holds after growing to ``frames_after``."""
        if window is not None:
            frames_now, frames_after = min(frames_now, window), min(frames_after, window)
        return held_bytes + self.per_frame * max(0, frames_after - frames_now)

    def admit_hop(self, flow: Any, stream: Any, call: dict) -> bool:
        """Whether ``stream`` (a FlowStream) may hold what it will after this ``flow.inference`` call."""
        tokens = int(call["token"].shape[1]) + int(call["prompt_token"].shape[1])
        frames_after = tokens * int(getattr(flow, "token_mel_ratio", 2))  # an upper bound: look-ahead included
        return self.admit(id(stream), self.need(stream.nbytes(), stream.frames_done, frames_after,
                                                stream.window_frames))

    def admit(self, key: int, want: int) -> bool:
        """Let stream ``key`` hold ``want`` bytes (False: it does not fit; it keeps what it had)."""
        with self._lock:
            held = self._held.get(key, 0)
            if self.used - held + want > self.max_bytes:
                return False
            self.used += want - held
            self._held[key] = want
        self.report()
        return True

    def settle(self, key: int, actual: int) -> None:
        """Stream ``key`` really holds ``actual`` bytes (after its hop)."""
        with self._lock:
            if key in self._held:
                self.used += actual - self._held[key]
                self._held[key] = actual
        self.report()

    def release(self, key: int) -> None:
        with self._lock:
            self.used -= self._held.pop(key, 0)
        self.report()

    def report(self) -> None:
        """Tell ``on_usage`` what is held now."""
        if self.on_usage is not None:
            with self._lock:
                used, streams = self.used, len(self._held)
            self.on_usage(used, self.max_bytes, streams)

    def refuse(self, key: int) -> None:
        """Stream ``key`` recomputes from now on: it gives back its bytes; counted and reported."""
        self.release(key)
        with self._lock:
            self.recomputed += 1
            used = self.used
        log.info("flow cache budget full (%.0f of %.0f MB held): a stream goes on by recomputing its prefix",
                 used / 2**20, self.max_bytes / 2**20)
        if self.on_recompute is not None:
            self.on_recompute()

    def stats(self) -> dict:
        with self._lock:
            return {"bytes": self.used, "max_bytes": self.max_bytes, "streams": len(self._held),
                    "recomputed": self.recomputed}
