"""How the batched LLM step talks to its device.

* :class:`StepIO`: the host <-> device traffic of the batched LLM: one upload of the step's
  inputs (pinned, asynchronous), one download of its log-probs (into a pinned buffer, one
  event wait), on the scheduler's own CUDA stream. On a CPU every part is a plain no-op
  copy, so the same code runs everywhere.
"""

from __future__ import annotations

import contextlib
from typing import Any


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
