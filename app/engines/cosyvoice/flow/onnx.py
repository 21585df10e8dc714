"""The flow's CFM estimator as an ONNX Runtime session (``engine.flow_runtime: onnxruntime``).

The estimator (CosyVoice2's ``CausalConditionalDecoder``, CosyVoice3's DiT, v1's
``ConditionalDecoder``) is the network the flow's ODE runs 10 times per call, ~90% of the
flow. Where the graph comes from, in order:

1. the model dir's ``flow.decoder.estimator.fp32.onnx`` (real model dirs ship it; upstream
   exports it with inputs ``x, mask, mu, t, spks, cond`` -> ``estimator_out``, batch 2, no
   chunk mask), if it loads and matches the loaded weights. It serves the calls it can:
   full attention (non-streaming) at its batch size; streamed hops (chunk-masked) stay in torch;
2. our own export, kept in a cache dir keyed by a SHA-256 of the estimator's weights (never in
   the model dir, which may be read-only): the same inputs plus ``chunk`` (the attention chunk
   in frames), with batch and length dynamic, so one graph serves every call: streamed hops
   with ``chunk = static_chunk_size``, whole calls with a chunk longer than any input (full
   attention). Written to a temporary file and renamed into place (atomic: a reader never sees
   half a file; concurrent exporters write the same bytes). An unwritable cache dir: the graph
   is kept in memory for this process.

Every graph is checked against the torch estimator at load (random inputs, each kind of call it
will serve, within ``TOLERANCE`` of the output's scale); one that does not match is not used. An
export that does not match (CosyVoice3's DiT: its rotary table is traced at the export's length)
leaves a marker instead of the graph, so later loads go straight to torch without exporting again.
One session per loaded model (with batching: one for all slots); ``session.run`` is thread-safe
and releases the GIL. Intra-op threads: ``engine.torch_threads`` (one per concurrent call
measured best on 2 cores, docs/cpu.md), without spin-waiting. Every run shrinks the CPU arena
(:func:`run_options`): what a run grew it by goes back at its end, so a long call's working set
(~0.5 GB at full size for 1,350 frames, ~2 GB for 2,100) is not kept for the life of the process.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from app.engines.cosyvoice.layout import FLOW_ESTIMATOR_ONNX

log = logging.getLogger("cosyserve.engine")
T = TypeVar("T")

MODEL_DIR_FILE = FLOW_ESTIMATOR_ONNX  # the name is the model-dir contract's (layout.py)
CACHE_FILE = "estimator.onnx"
UNUSABLE_FILE = "estimator.unusable"  # unusable_marker(CACHE_FILE): an export that did not match torch
INPUTS = ("x", "mask", "mu", "t", "spks", "cond")
EXPORT_VERSION = 1  # part of the cache key: bump when the exported graph's interface changes
TOLERANCE = 1e-4  # largest |ORT - torch| accepted, relative to the largest |torch output|
FULL_ATTENTION = 1 << 30  # a chunk longer than any input: every frame sees every frame


class OnnxUnavailable(RuntimeError):
    """No usable ONNX graph for this estimator (the message says why)."""


def weights_key(estimator: Any) -> str:
    """SHA-256 of what the exported graph depends on: the estimator's class, chunk size and weights."""
    h = hashlib.sha256()
    h.update(f"{EXPORT_VERSION};{type(estimator).__name__};{chunk_size(estimator)};".encode())
    for name, tensor in sorted(estimator.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name};{t.dtype};{tuple(t.shape)};".encode())
        h.update(memoryview(t.reshape(-1).view(_uint8()).numpy()))
    return h.hexdigest()


def _uint8() -> Any:
    import torch

    return torch.uint8


def chunk_size(estimator: Any) -> int:
    """The estimator's streaming attention chunk in frames (0: it has no chunk mask)."""
    value = getattr(estimator, "static_chunk_size", 0)
    return int(value) if isinstance(value, int) and value > 0 else 0


@dataclass
class OnnxEstimator:
    """One ONNX Runtime session standing in for the torch estimator on the calls it can serve."""

    session: Any
    chunk: int  # the torch estimator's chunk (0: none); the graph takes a ``chunk`` input when it can
    source: str  # "model dir" | "cache" | "exported" | "memory"
    chunked: bool  # the graph has a chunk input: it serves streamed (chunk-masked) calls too
    batch: int | None  # the only batch size the graph takes (None: any)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.frames = 0  # estimator frames served (x's length x batch / 2 rows: CFG pairs), for benchmarks

    def serves(self, batch: int, streaming: bool) -> bool:
        if self.batch is not None and batch != self.batch:
            return False
        return not (streaming and self.chunk) or self.chunked

    def __call__(self, x: Any, mask: Any, mu: Any, t: Any, spks: Any, cond: Any, streaming: bool = False) -> Any:
        import numpy as np
        import torch

        feed = {name: as_array(v) for name, v in zip(INPUTS, (x, mask, mu, t, spks, cond), strict=True)}
        if self.chunked:
            feed["chunk"] = np.array([self.chunk if streaming else FULL_ATTENTION], dtype=np.int64)
        out = self.session.run(None, feed, run_options())[0]
        with self._lock:
            self.frames += int(x.shape[2])
        return torch.from_numpy(out).to(x.dtype)


def as_array(value: Any) -> Any:
    """A tensor as the contiguous fp32 numpy array a session takes."""
    import numpy as np

    return np.ascontiguousarray(value.detach().cpu().float().numpy())


def _chunked_wrapper(estimator: Any) -> Any:
    """A module with a ``chunk`` input that runs ``estimator`` with that attention chunk (for export only)."""
    import torch

    class Chunked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = estimator

        def forward(self, x: Any, mask: Any, mu: Any, t: Any, spks: Any, cond: Any, chunk: Any) -> Any:
            saved = self.inner.static_chunk_size
            self.inner.static_chunk_size = chunk  # traced: the chunk mask becomes a function of the input
            try:
                return self.inner(x, mask, mu, t, spks, cond, streaming=True)
            finally:
                self.inner.static_chunk_size = saved

    return Chunked().train(estimator.training)  # a new Module trains: export would restore that onto the estimator


def _dummy(estimator: Any, batch: int, frames: int, seed: int) -> tuple:
    import torch

    gen = torch.Generator().manual_seed(seed)
    channels = int(getattr(estimator, "out_channels", 80))
    spk = torch.randn(batch, channels, generator=gen)
    return (torch.randn(batch, channels, frames, generator=gen), torch.ones(batch, 1, frames),
            torch.randn(batch, channels, frames, generator=gen), torch.rand(batch, generator=gen),
            spk, torch.randn(batch, channels, frames, generator=gen))


def export(estimator: Any, target: Any) -> None:
    """Write ``estimator`` as an ONNX graph (with a ``chunk`` input where it has a chunk mask) to ``target``.

    The estimator comes back in the mode it was in: ``torch.onnx.export`` restores the exported module's
    mode onto every submodule, and a wrapper left in training mode turned the loaded estimator's dropout on
    (noise in every later torch flow pass of the process, and seeded requests no longer reproducible).
    """
    import torch

    chunk = chunk_size(estimator)
    frames = 2 * chunk + 17 if chunk else 117
    args = _dummy(estimator, 2, frames, seed=0)
    names = list(INPUTS)
    module = estimator
    if chunk:
        module = _chunked_wrapper(estimator)
        args = (*args, torch.tensor([chunk], dtype=torch.int64))
        names.append("chunk")
    axes = {n: {0: "batch", 2: "frames"} for n in ("x", "mask", "mu", "cond", "estimator_out")}
    axes |= {"t": {0: "batch"}, "spks": {0: "batch"}}
    trace(estimator, module, args, target, names, ["estimator_out"], axes)


def trace(estimator: Any, module: Any, args: tuple, target: Any, names: list[str], outputs: list[str],
          axes: dict[str, dict[int, str]]) -> None:
    """``torch.onnx.export`` of ``module`` (``estimator`` or a wrapper around it) to ``target``, with every
    submodule of ``estimator`` left in the mode it was in (see ``export``)."""
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        # the TorchScript exporter (no onnxscript needed) warns that it is legacy, and traces with warnings
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        # the estimator's strided slices cannot be folded into constants: the graph keeps them (exact)
        warnings.filterwarnings("ignore", message="Constant folding - Only steps=1 can be constant folded",
                                category=UserWarning)
        modes = {m: m.training for m in estimator.modules()}
        try:
            torch.onnx.export(module, args, target, dynamo=False, opset_version=18, do_constant_folding=True,
                              input_names=names, output_names=outputs, dynamic_axes=axes)
        finally:
            for m, training in modes.items():
                m.training = training


@functools.cache
def run_options() -> Any:
    """The options every session run takes: ONNX Runtime's CPU arena, which only grows by default (by
    powers of two, kept for the process's life), gives back at the end of each run the regions the run
    added. Measured at full size (docs/memory.md, "ONNX Runtime's arena at full size"): RSS after calls of
    up to 2,100 frames stays at its level at load (+4 MB) where the arena kept +1.9 GB, at ~5 % more
    estimator time on long calls (the run re-faults its working set); the arena off instead kept
    nothing but took 2.3x the time (every tensor its own mapping). Shared by every run (read-only)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def open_session(model: str | bytes, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    # no memory pattern: it plans one block per input shape, and every request and hop brings a new shape, so the
    # arena kept growing (docs/memory.md: 4,000 calls of random shapes, RSS +55 MB with it, +4 MB without, no slower)
    so.enable_mem_pattern = False
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no CPU burnt waiting for work
    return ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])


def _wrap(session: Any, estimator: Any, source: str) -> OnnxEstimator:
    inputs = {i.name: i for i in session.get_inputs()}
    missing = [n for n in INPUTS if n not in inputs]
    if missing:
        raise OnnxUnavailable(f"the graph has no input(s) {', '.join(missing)}")
    batch = inputs["x"].shape[0]
    return OnnxEstimator(session=session, chunk=chunk_size(estimator), source=source, chunked="chunk" in inputs,
                         batch=batch if isinstance(batch, int) else None)


def check(onnx_est: OnnxEstimator, estimator: Any) -> float:
    """Largest relative difference to the torch estimator over the kinds of calls the graph serves."""
    import torch

    worst = 0.0
    frames = 2 * onnx_est.chunk + 9 if onnx_est.chunk else 69
    batches = [onnx_est.batch] if onnx_est.batch else [1, 2]
    with torch.inference_mode():
        for i, batch in enumerate(batches):
            for streaming in (False, True):
                if not onnx_est.serves(batch, streaming):
                    continue
                args = _dummy(estimator, batch, frames, seed=1 + i)
                ref = estimator(*args, streaming=streaming)
                got = onnx_est(*args, streaming=streaming)
                worst = max(worst, float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)))
    return worst


def _checked(onnx_est: OnnxEstimator, estimator: Any, what: str) -> OnnxEstimator:
    diff = check(onnx_est, estimator)
    if diff > TOLERANCE:
        raise OnnxUnavailable(f"{what} differs from the loaded estimator by {diff:.1e} of its scale")
    return onnx_est


def _write_atomically(path: Path, write: Callable[[Any], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".estimator-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mark_unusable(graph: Path, reason: str) -> None:
    """Replace a graph that does not match torch by a marker saying why (best effort)."""
    try:
        unusable_marker(graph).write_text(reason + "\n")
        graph.unlink(missing_ok=True)
    except OSError:
        pass


def unusable_marker(graph: Path) -> Path:
    """The marker left instead of ``graph`` when its export did not match torch (``estimator.unusable``)."""
    return graph.with_suffix(".unusable")


def load_graph(*, key: str, filename: str, cache_dir: str | os.PathLike | None, write: Callable[[Any], None],
               open_graph: Callable[[str | bytes, str], T]) -> T:
    """A graph of the weights ``key`` from ``cache_dir``, else exported by ``write`` (into the cache dir, or into
    memory when there is none or it is not writable), opened and checked by ``open_graph(path or bytes, source)``
    (which raises OnnxUnavailable when the graph does not match torch)."""
    cached = Path(cache_dir).expanduser() / key[:32] / filename if cache_dir is not None else None
    if cached is not None and cached.is_file():
        try:
            return open_graph(str(cached), "cache")
        except Exception as exc:  # noqa: BLE001 - a stale or damaged cache entry: export again
            log.warning("engine.flow_runtime: cached graph %s unusable (%s); exporting again", cached, exc)
    if cached is not None:
        unusable = unusable_marker(cached)
        if unusable.is_file():
            raise OnnxUnavailable(f"an earlier export of these weights did not match torch ({unusable.read_text().strip()}; "
                                  f"delete {unusable.parent} to try again)")
        try:
            _write_atomically(cached, write)
            log.info("engine.flow_runtime: exported %s", cached)
        except OSError as exc:
            log.warning("engine.flow_runtime: cannot write %s (%s); keeping the exported graph in memory", cached, exc)
        else:
            try:
                return open_graph(str(cached), "exported")
            except OnnxUnavailable as exc:
                _mark_unusable(cached, str(exc))
                raise
    buf = io.BytesIO()
    write(buf)
    return open_graph(buf.getvalue(), "memory")


def load_onnx_estimator(estimator: Any, *, model_dir: str | os.PathLike | None, cache_dir: str | os.PathLike | None,
                        threads: int = 1) -> OnnxEstimator:
    """The estimator's ONNX Runtime stand-in (model dir file, else cache, else a fresh export); checked."""
    shipped = Path(model_dir) / MODEL_DIR_FILE if model_dir is not None else None
    if shipped is not None and shipped.is_file():
        try:
            return _checked(_wrap(open_session(str(shipped), threads), estimator, "model dir"), estimator,
                            f"the model dir's {MODEL_DIR_FILE}")
        except Exception as exc:  # noqa: BLE001 - any failure here means: export our own instead
            log.warning("engine.flow_runtime: not using %s (%s); exporting the estimator instead", shipped, exc)

    def opened(model: str | bytes, source: str) -> OnnxEstimator:
        return _checked(_wrap(open_session(model, threads), estimator, source), estimator,
                        "the export" if source != "cache" else "the cached graph")

    return load_graph(key=weights_key(estimator), filename=CACHE_FILE, cache_dir=cache_dir,
                      write=lambda f: export(estimator, f), open_graph=opened)
