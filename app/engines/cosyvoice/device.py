"""Which device an engine runs on (``engine.device``), what it is, and how the LLM step talks to it.

* :func:`resolve_device`: ``auto | cpu | cuda | cuda:N`` -> a ``torch.device``; asking for a
  CUDA device this process cannot use is a load error that names the fix (it never falls
  back to the CPU silently: a CPU server on a GPU host looks healthy and is 20x slower).
* :func:`describe_device`: what the load log says about it (name, compute capability, CUDA
  runtime and driver versions).
* :class:`StepIO`: the host <-> device traffic of the batched LLM: one upload of the step's
  inputs (pinned, asynchronous), one download of its log-probs (into a pinned buffer, one
  event wait), on the scheduler's own CUDA stream. On a CPU every part is a plain no-op
  copy, so the same code runs everywhere.
* :func:`cuda_memory`: allocated / reserved / peak bytes per CUDA device this process
  initialised ({} otherwise), read by ``/metrics``; it never imports torch itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import subprocess
import sys
from typing import Any

from app.engines.base import EngineFailure

log = logging.getLogger("cosyserve.engine")

DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
FIX = ("set engine.device: cpu (COSYSERVE_ENGINE__DEVICE=cpu) to run on the CPU, or install a CUDA build of torch "
       "that matches this host's NVIDIA driver (check `nvidia-smi` and torch.version.cuda)")


class DeviceUnavailable(EngineFailure):
    """``engine.device`` names a device this process cannot use."""


def resolve_device(spec: str = "auto", *, cuda_available: bool | None = None,
                   device_count: int | None = None) -> Any:
    """``engine.device`` as a ``torch.device``: auto (CUDA if usable, else CPU), cpu, cuda, cuda:N."""
    import torch

    spec = (spec or "auto").strip().lower()
    if not DEVICE_RE.match(spec):
        raise DeviceUnavailable(f"engine.device must be auto, cpu, cuda or cuda:N, not {spec!r}")
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if spec == "auto" and not available and torch.version.cuda is not None:
        _warn_cuda_build_without_gpu(torch.version.cuda)
    if spec == "cpu" or (spec == "auto" and not available):
        return torch.device("cpu")
    if spec == "auto":
        return torch.device("cuda", 0)
    if not available:
        built = torch.version.cuda
        why = ("this torch is a CPU-only build" if built is None
               else f"torch (built for CUDA {built}) finds no usable GPU or driver")
        raise DeviceUnavailable(f"engine.device is {spec!r} but {why}; {FIX}")
    count = torch.cuda.device_count() if device_count is None else device_count
    index = int(spec.split(":")[1]) if ":" in spec else 0
    if index >= count:
        raise DeviceUnavailable(f"engine.device is {spec!r} but this process sees {count} CUDA device(s) "
                                f"(CUDA_VISIBLE_DEVICES renumbers them from 0); pick cuda:0..cuda:{count - 1}")
    return torch.device("cuda", index)


@functools.cache
def _warn_cuda_build_without_gpu(cuda: str) -> None:
    """Once per process: the server resolves the device at start and again in every engine load."""
    log.warning("engine.device auto: this torch is built for CUDA %s but finds no usable GPU (driver too old, "
                "no device visible?); running on the CPU. Set engine.device: cuda to fail instead.", cuda)


def driver_version() -> str:
    """The NVIDIA driver version (nvidia-ml-py if installed, else nvidia-smi), or "unknown"."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - not installed, or no NVML here: try the CLI
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def describe_device(device: Any) -> dict[str, Any]:
    """What the load log and the GPU check report about ``device``."""
    import torch

    device = torch.device(device)
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    if device.type != "cuda":
        info["name"] = "cpu"
        return info
    index = device.index if device.index is not None else 0
    props = torch.cuda.get_device_properties(index)
    info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                driver=driver_version(), bf16=bool(torch.cuda.is_bf16_supported()))
    return info


def device_text(info: dict[str, Any]) -> str:
    """One line for the load log."""
    if info.get("name") == "cpu":
        return f"device cpu (torch {info['torch']})"
    return (f"device {info['device']} ({info['name']}, compute capability {info['capability']}, "
            f"{info['memory_gib']} GiB, CUDA {info['cuda']}, driver {info['driver']}, torch {info['torch']})")


def cuda_memory() -> dict[str, dict[str, int]]:
    """``{"cuda:0": {"allocated": b, "reserved": b, "peak": b}, ...}`` for the CUDA devices in use here.

    Empty on a CPU server: it reads torch only if this process already imported it and
    initialised CUDA, so a scrape never starts CUDA (nor imports torch) by itself.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        if not torch.cuda.is_initialized():
            return {}
        out = {}
        for i in range(torch.cuda.device_count()):
            out[f"cuda:{i}"] = {"allocated": int(torch.cuda.memory_allocated(i)),
                                "reserved": int(torch.cuda.memory_reserved(i)),
                                "peak": int(torch.cuda.max_memory_allocated(i))}
        return out
    except Exception:  # noqa: BLE001 - a scrape must not fail on a driver hiccup
        return {}


def ready_event(device: Any) -> Any:
    """An event marking the work queued so far on this thread's current CUDA stream (None on a CPU)."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def to_device(tensor: Any, device: Any) -> Any:
    """A host tensor on ``device`` without blocking this thread (pinned, asynchronous copy on CUDA)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type == "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


class StepIO:
    """The batched LLM's host <-> device traffic, on its own CUDA stream (plain copies on a CPU).

    * ``upload(rows)``: Python ints -> one device tensor (pinned memory, asynchronous copy:
      the host never waits for the GPU to upload).
    * ``download(t)``: a device tensor -> fp32 host tensor, the step's one synchronisation
      (an asynchronous copy into a pinned buffer, then a wait for that copy's event: the
      other streams, e.g. the requests' flow/HiFT on the default stream, are not drained).
      The result is a view of a buffer the next ``download`` reuses.
    * ``adopt(tensor, event)``: a tensor another thread made on its own stream (a request's
      LLM input): this stream waits for ``event`` before reading it, and the allocator is told
      that this stream uses it (``record_stream``), so its memory is not reused too early.
    """

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._done = torch.cuda.Event() if self.cuda else None
        self._buffer: Any = None  # pinned host buffer, grown as needed

    def context(self) -> Any:
        """Run the caller's work on this stream (a thread-local setting: enter it in the scheduler thread)."""
        import torch

        if not self.cuda:
            return contextlib.nullcontext()
        # everything queued before (the weights' upload at load) happens before our first kernel
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self.stream)

    def upload(self, rows: Any, dtype: Any = None) -> Any:
        import torch

        host = torch.tensor(rows, dtype=dtype or torch.long)
        if not self.cuda:
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def download(self, tensor: Any) -> Any:
        import torch

        if not self.cuda:
            return tensor.detach().to("cpu", torch.float32, copy=True)
        src = tensor.detach().float()
        n = src.numel()
        if self._buffer is None or self._buffer.numel() < n:
            self._buffer = torch.empty(max(n, 1), dtype=torch.float32, pin_memory=True)
        out = self._buffer[:n].view(src.shape)
        out.copy_(src, non_blocking=True)
        self._done.record(torch.cuda.current_stream(self.device))
        self._done.synchronize()
        return out

    def release_cache(self) -> None:
        """After an out-of-memory error: hand the allocator's unused cached blocks back (CUDA)."""
        if self.cuda:
            import torch

            torch.cuda.empty_cache()

    def adopt(self, tensor: Any, event: Any) -> None:
        if not self.cuda or tensor is None:
            return
        import torch

        stream = torch.cuda.current_stream(self.device)
        if event is not None:
            stream.wait_event(event)
        if tensor.device.type == "cuda":
            tensor.record_stream(stream)
