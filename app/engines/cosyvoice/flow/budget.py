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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("cosyserve.engine")

ODE_STEPS = 10  # CosyVoice2's CFM solve: every step keeps its own keys/values per frame
CFG_ROWS = 2  # classifier-free guidance runs two rows per frame


def bytes_per_frame(flow: Any, element_size: int = 4) -> int:
    """What one more cached estimator frame costs: keys + values of every attention layer, every ODE step.

    ``element_size``: bytes per activation (4 for fp32, an upper bound for bf16/fp16 runs).
    """
    per_step = 0
    for module in flow.decoder.estimator.modules():
        if hasattr(module, "to_k") and hasattr(module, "to_v"):
            per_step += CFG_ROWS * (module.to_k.out_features + module.to_v.out_features)
    return per_step * ODE_STEPS * element_size


class FlowCacheBudget:
    """Bytes held by all streams' flow caches, at most ``max_bytes`` (thread-safe)."""

    def __init__(self, max_bytes: int, per_frame: int, on_recompute: Callable[[], None] | None = None) -> None:
        self.max_bytes = int(max_bytes)
        self.per_frame = int(per_frame)
        self.on_recompute = on_recompute
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
            return True

    def settle(self, key: int, actual: int) -> None:
        """Stream ``key`` really holds ``actual`` bytes (after its hop)."""
        with self._lock:
            if key in self._held:
                self.used += actual - self._held[key]
                self._held[key] = actual

    def release(self, key: int) -> None:
        with self._lock:
            self.used -= self._held.pop(key, 0)

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
