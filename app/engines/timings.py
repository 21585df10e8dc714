"""Per-request stage timings: where one request's time goes.

Stages (``STAGES``): ``frontend`` (text tokens, prompt features), ``llm`` (speech
tokens: wall time from the LLM's start to its last token, which overlaps flow and
HiFT while streaming), ``flow`` (tokens -> mel), ``hift`` (mel -> waveform) and
``encode`` (PCM -> the response format). A :class:`StageTimings` travels with the
``SynthesisRequest``; the engine and the encoder add to it, the HTTP layer reports
it (access log, ``tts_stage_seconds``). No torch here.

Flow and HiFT run inside CosyVoice's ``token2wav``, shared by all requests of a
model; ``timed`` wraps their entry points once at load and adds each call to the
timings *bound to the calling thread* (``bound``): token2wav runs in the request's
own slot thread.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

STAGES: tuple[str, ...] = ("frontend", "llm", "flow", "hift", "encode")

_local = threading.local()


class StageTimings:
    """Seconds per stage for one request (thread-safe adds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._s: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self._s[stage] = self._s.get(stage, 0.0) + max(0.0, float(seconds))

    @contextlib.contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - t0)

    def snapshot(self) -> dict[str, float]:
        """The stages seen so far, in STAGES order."""
        with self._lock:
            return {s: self._s[s] for s in STAGES if s in self._s}

    def text(self) -> str:
        """``frontend=12ms,llm=310ms,...`` for the access log ("-" when nothing was timed)."""
        snap = self.snapshot()
        return ",".join(f"{k}={v * 1000:.0f}ms" for k, v in snap.items()) or "-"


@contextlib.contextmanager
def bound(timings: StageTimings | None) -> Iterator[None]:
    """Make ``timings`` the current thread's (what ``timed`` functions add to) for the block."""
    previous = getattr(_local, "timings", None)
    _local.timings = timings
    try:
        yield
    finally:
        _local.timings = previous


def current() -> StageTimings | None:
    return getattr(_local, "timings", None)


def timed(fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
    """``fn`` that adds its duration to the calling thread's bound timings (if any)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        timings = current()
        if timings is None:
            return fn(*args, **kwargs)
        with timings.measure(stage):
            return fn(*args, **kwargs)

    wrapper.__cosyserve_timed__ = stage  # type: ignore[attr-defined]
    return wrapper


def bound_iter(it: Iterator[Any], timings: StageTimings | None) -> Iterator[Any]:
    """Iterate ``it`` with ``timings`` bound while its code runs (not while the consumer runs)."""
    try:
        while True:
            with bound(timings):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            with bound(timings):
                close()


def instrument(model: Any) -> None:
    """Time a CosyVoice model's flow and HiFT calls (``model.flow.inference``, ``model.hift.inference``)."""
    for attr, stage in (("flow", "flow"), ("hift", "hift")):
        module = getattr(model, attr, None)
        fn = getattr(module, "inference", None)
        if fn is not None and not hasattr(fn, "__cosyserve_timed__"):
            module.inference = timed(fn, stage)
