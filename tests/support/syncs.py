"""Count host <-> device synchronisations, on a CPU (a proxy) or on CUDA (the driver's own check).

A GPU runs ahead of the host only while the host never waits for it. These make the
host wait: reading a value (``.item()``, ``int()``/``float()``/``bool()`` of a tensor,
``.tolist()``, ``.numpy()``), a copy to the host (``.cpu()``, ``.to("cpu")``), and ops
whose output size depends on values (``nonzero``, boolean-mask indexing,
``masked_select``, ``unique``). On a CPU nothing waits, so :class:`HostSyncCounter`
counts what *would* wait on a device: it follows where every tensor came from while it
is active (a dispatch mode), treats the result of a copy to the host, and anything
computed only from such results, as host memory, everything else (weights, the KV
cache, fresh tensors the step makes) as device memory, and counts the operations above
on device tensors. So sampling on the host copy costs nothing, and the step's one
download counts one.

    counter = HostSyncCounter()
    scheduler = LLMScheduler(lm, step_probe=counter.probe)   # entered around each step
    ...
    counter.per_step          # [syncs in step 1, syncs in step 2, ...]
    counter.kinds             # {"_local_scalar_dense": 3, "to_host": 1, ...}

On CUDA, :class:`CudaSyncCounter` uses ``torch.cuda.set_sync_debug_mode("warn")`` inside
each step instead and counts its warnings (PyTorch flags stream/device synchronisations
and blocking copies; an event wait, the step's one deliberate wait, is not flagged).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

SCALAR_READS = {"_local_scalar_dense", "item", "equal", "is_nonzero", "allclose"}
VALUE_SHAPED = {"nonzero", "nonzero_static", "masked_select", "masked_scatter", "unique", "_unique", "_unique2",
                "unique_dim", "unique_consecutive", "repeat_interleave", "bincount", "histc"}


class _Tracker:
    """Which live tensors hold host memory (by identity; dropped with the tensor)."""

    def __init__(self) -> None:
        self._host: dict[int, weakref.ref] = {}

    def mark(self, t: Any) -> None:
        key = id(t)
        self._host[key] = weakref.ref(t, lambda _r, k=key: self._host.pop(k, None))

    def is_host(self, t: Any) -> bool:
        ref = self._host.get(id(t))
        return ref is not None and ref() is t


def _tensors(obj: Any) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def _modes(counter: HostSyncCounter) -> tuple[Any, Any]:
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    tracker = counter.tracker

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            ins = list(_tensors(args)) + list(_tensors(kwargs))
            all_host = bool(ins) and all(tracker.is_host(t) for t in ins)
            name = func.__name__.split(".")[0]
            to_host = name in ("_to_copy", "_copy_from") and _device_kw(kwargs) == "cpu"  # counted as Tensor.to
            into_host = (name == "copy_" and len(ins) >= 2 and tracker.is_host(ins[0])
                         and not tracker.is_host(ins[1]))  # a device -> pinned-buffer copy
            if not all_host:
                if into_host:
                    counter.count("to_host")
                elif name in SCALAR_READS or name in VALUE_SHAPED:
                    counter.count(name)
                elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and _bool_index(args):
                    counter.count("bool_mask_index")
            out = func(*args, **kwargs)
            mutated = name.endswith("_") and not name.startswith("_")
            scalar = name == "lift_fresh" and isinstance(out, torch.Tensor) and out.dim() == 0
            if (all_host or to_host or scalar) and not mutated:  # a Python scalar operand is a host value
                for t in _tensors(out):
                    tracker.mark(t)
            return out

    class Function(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            source = args[0] if args and isinstance(args[0], torch.Tensor) else None
            to_host = name == "cpu" or (name == "to" and _names_cpu(args[1:], kwargs))
            if source is not None and not tracker.is_host(source):
                if name in ("tolist", "numpy"):
                    counter.count(name)
                elif to_host:
                    counter.count("to_host")
            out = func(*args, **kwargs)
            if source is not None and to_host:
                for t in _tensors(out):
                    tracker.mark(t)
            return out

    return Dispatch(), Function()


def _names_cpu(args: tuple, kwargs: dict) -> bool:
    # only a literal "cpu": ``.to(x.device)`` names the tensor's own device, a no-op on a GPU too
    return any(isinstance(v, str) and v.split(":")[0] == "cpu" for v in (*args, kwargs.get("device")))


def _device_kw(kwargs: dict) -> str | None:
    device = kwargs.get("device")
    return None if device is None else str(getattr(device, "type", device))


def _bool_index(args: tuple) -> bool:
    import torch

    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()) if i is not None)


class HostSyncCounter:
    """The CPU proxy: host syncs a step would make on a device (see the module docstring)."""

    def __init__(self) -> None:
        self.tracker = _Tracker()
        self.per_step: list[int] = []
        self.kinds: Counter[str] = Counter()
        self._current = 0
        self._lock = threading.Lock()

    def count(self, kind: str) -> None:
        self._current += 1
        self.kinds[kind] += 1

    @contextlib.contextmanager
    def probe(self) -> Iterator[None]:
        """Count one step (enter it in the thread that runs the step)."""
        dispatch, function = _modes(self)
        self._current = 0
        with function, dispatch:
            yield
        with self._lock:
            self.per_step.append(self._current)


class CudaSyncCounter:
    """On CUDA: synchronisations PyTorch itself flags (``set_sync_debug_mode``) per step."""

    def __init__(self) -> None:
        self.per_step: list[int] = []
        self.messages: Counter[str] = Counter()

    @contextlib.contextmanager
    def probe(self) -> Iterator[None]:
        import torch

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode("default")
        flagged = [w for w in seen if "synchroniz" in str(w.message)]
        for w in flagged:
            self.messages[str(w.message).splitlines()[0][:120]] += 1
        self.per_step.append(len(flagged))


def summary(per_step: list[int]) -> dict[str, Any]:
    if not per_step:
        return {"steps": 0}
    return {"steps": len(per_step), "max": max(per_step), "mean": round(sum(per_step) / len(per_step), 2)}
