"""Cancellation that reaches inside CosyVoice.

``CosyVoiceModel.tts()`` starts its own thread for the LLM (``llm_job``) and
that thread runs to the end even when the caller stops iterating. We wrap the
model's ``llm_job`` / ``vc_job`` (so we learn each call's internal uuid, keyed
by the identity of the token tensor we passed in) and ``llm.inference`` (so the
token loop checks our cancel flag after every token). After a cancel the
per-request state CosyVoice keeps in its ``*_dict`` maps is removed, because
closing the ``tts()`` generator early skips its own cleanup.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass
class CallContext:
    cancel: threading.Event
    aborted: threading.Event = field(default_factory=threading.Event)
    uuid: str | None = None
    worker_started: threading.Event = field(default_factory=threading.Event)
    worker_done: threading.Event = field(default_factory=threading.Event)
    tokens: int = 0
    llm_s: float = 0.0  # wall seconds from the LLM's start to its last token


class CancelRegistry:
    """Per-model bookkeeping of in-flight ``tts()`` calls (safe for a shared model)."""

    def __init__(self, model: Any, observer: Any = None) -> None:
        self.model = model
        self.observer = observer  # LLMObserver: per-request decoding counts as steps of batch 1
        self._lock = threading.Lock()
        self._by_tensor: dict[int, CallContext] = {}
        self._by_uuid: dict[str, CallContext] = {}
        self._install()

    # -- registration around one tts() call -------------------------------------------------
    def begin(self, key_tensor: Any, cancel: threading.Event) -> CallContext:
        ctx = CallContext(cancel=cancel)
        with self._lock:
            self._by_tensor[id(key_tensor)] = ctx
        return ctx

    def end(self, key_tensor: Any, ctx: CallContext, *, aborted: bool, wait_s: float = 30.0) -> None:
        """Forget a call; after an aborted call, wait for CosyVoice's worker thread and drop its state."""
        with self._lock:
            self._by_tensor.pop(id(key_tensor), None)
        if aborted:
            ctx.aborted.set()
            if ctx.worker_started.wait(wait_s):
                ctx.worker_done.wait(wait_s)
            if ctx.uuid is not None:
                self._drop_state(ctx.uuid)
        if ctx.uuid is not None:
            with self._lock:
                self._by_uuid.pop(ctx.uuid, None)

    def active(self) -> int:
        with self._lock:
            return len(self._by_tensor)

    # -- wrappers ---------------------------------------------------------------------------------
    def _lookup(self, tensor: Any) -> CallContext | None:
        with self._lock:
            return self._by_tensor.get(id(tensor))

    def _install(self) -> None:
        model = self.model
        if getattr(model, "_cosyserve_cancel", None) is not None:
            raise RuntimeError("a CancelRegistry is already installed on this model")
        model._cosyserve_cancel = self
        for name in ("llm_job", "vc_job"):
            original = getattr(model, name, None)
            if original is not None:
                setattr(model, name, self._wrap_job(original))
        llm = getattr(model, "llm", None)
        if llm is not None and hasattr(llm, "inference"):
            llm.inference = self._wrap_inference(llm.inference)

    def _wrap_job(self, original: Any) -> Any:
        registry = self

        @functools.wraps(original)
        def job(*args: Any, **kwargs: Any) -> Any:
            key = args[0] if args else next(iter(kwargs.values()), None)
            this_uuid = args[-1] if len(args) >= 2 else kwargs.get("uuid")
            ctx = registry._lookup(key)
            if ctx is None:
                return original(*args, **kwargs)
            ctx.uuid = this_uuid
            with registry._lock:
                registry._by_uuid[this_uuid] = ctx
            ctx.worker_started.set()
            try:
                return original(*args, **kwargs)
            finally:
                ctx.worker_done.set()

        return job

    def _wrap_inference(self, original: Any) -> Any:
        registry = self

        @functools.wraps(original)
        def inference(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with registry._lock:
                ctx = registry._by_uuid.get(kwargs.get("uuid", ""))
            gen = original(*args, **kwargs)
            if ctx is None:
                yield from gen
                return
            observer = registry.observer
            started = time.perf_counter()
            try:
                t0 = started
                for token in gen:
                    if ctx.cancel.is_set() or ctx.aborted.is_set():
                        return
                    ctx.tokens += 1
                    if observer is not None:
                        observer.on_step(1, time.perf_counter() - t0)
                        observer.on_tokens(1)
                    yield token
                    t0 = time.perf_counter()
            finally:
                gen.close()
                ctx.llm_s += time.perf_counter() - started

        return inference

    def _drop_state(self, this_uuid: str) -> None:
        model = self.model
        lock = getattr(model, "lock", None) or threading.Lock()
        with lock:
            for name, value in vars(model).items():
                if name.endswith("_dict") and isinstance(value, dict):
                    value.pop(this_uuid, None)
