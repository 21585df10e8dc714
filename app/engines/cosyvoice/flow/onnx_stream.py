"""The flow cache's estimator on ONNX Runtime: a graph that takes and returns a stream's caches.

The flow cache (``flow/cache.py``) runs each streamed hop's ODE over the hop's new frames,
given per ODE step each causal convolution's last input frames and each attention layer's
keys and values of every earlier frame. On torch those are hooks around the modules. Here
they are a graph's inputs and outputs, the way LLM decoders export their past keys and
values: ``x, mask, mu, t, spks, cond`` of the new frames, then every convolution's tail
(``conv<i>``, ``[rows, channels, kernel - 1]``, fp32), every layer's past keys and values
(``k<i>``, ``v<i>``, ``[rows, heads, past, head_dim]`` in the cache's storage precision,
``past`` 0 on a stream's first call); out come the estimator's output, the tails to keep
and the keys and values of past + new frames, in the same precision. One graph serves every
hop of every stream and every ODE step (the step picks which cache the caller feeds).

The graph is traced from the torch estimator with our own hooks bound (so both runtimes
compute the same function), checked against them at load on a first and a later call,
and kept in ``engine.onnx_cache_dir`` beside the plain estimator graph (``flow/onnx.py``),
keyed by the same weights hash. Measured on CPU at full size (docs/cpu.md): 1.5x faster per
hop than the torch hooks, which is why the flow cache follows ``engine.flow_runtime``.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from app.engines.cosyvoice.flow.onnx import (
    INPUTS,
    OnnxUnavailable,
    as_array,
    load_graph,
    open_session,
    run_options,
    trace,
    weights_key,
)

log = logging.getLogger("cosyserve.engine")

TOLERANCE = 1e-4  # largest |ORT - torch| of the estimator output, relative to its scale (fp32 caches)
TOLERANCE_REDUCED = 1e-2  # with fp16 caches: both round the same values, a flipped last bit moves them apart
STORAGE = ("fp32", "fp16")  # what the graph's key/value caches are stored in (numpy has no bf16)


def graph_file(storage: str) -> str:
    return f"estimator-stream-{storage}.onnx"


def _torch_dtype(storage: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16}[storage]


def _modules(estimator: Any) -> tuple[list, list]:
    """The estimator's causal convolutions and self-attentions, in module order (the graph's input order)."""
    convs = [m for m in estimator.modules() if type(m).__name__ == "CausalConv1d"]
    attns = [m for m in estimator.modules() if hasattr(m, "set_processor") and hasattr(m, "to_k")]
    return convs, attns


def _names(convs: list, attns: list) -> tuple[list[str], list[str]]:
    state = [f"conv{i}" for i in range(len(convs))] + [f"k{i}" for i in range(len(attns))] + \
            [f"v{i}" for i in range(len(attns))]
    return list(INPUTS) + state, ["estimator_out"] + [f"{n}_out" for n in state]


def _traced(estimator: Any, convs: list, attns: list, storage: str) -> Any:
    """A module computing one cached estimator call with its caches as arguments and results (export only)."""
    import torch

    from app.engines.cosyvoice.flow.cache import FlowStream, bound_stream

    dtype = _torch_dtype(storage)

    class Stepped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = estimator

        def forward(self, x: Any, mask: Any, mu: Any, t: Any, spks: Any, cond: Any, *state: Any) -> tuple:
            n_conv, n_attn = len(convs), len(attns)
            stream = FlowStream(kv_dtype=dtype)
            for m, tail in zip(convs, state[:n_conv], strict=True):
                stream.conv[(0, id(m))] = tail
            for a, k, v in zip(attns, state[n_conv:n_conv + n_attn], state[n_conv + n_attn:], strict=True):
                stream.kv[(0, id(a))] = (k, v)
            with bound_stream(stream):
                out = self.inner(x, mask, mu, t, spks, cond, streaming=True)
            return (out, *(stream.conv[(0, id(m))] for m in convs), *(stream.kv[(0, id(a))][0] for a in attns),
                    *(stream.kv[(0, id(a))][1] for a in attns))

    return Stepped().train(estimator.training)  # see flow/onnx.py export(): the wrapper must not train


def _dummy(estimator: Any, convs: list, attns: list, storage: str, frames: int, past: int, seed: int) -> tuple:
    import torch

    gen = torch.Generator().manual_seed(seed)
    rows, channels = 2, int(getattr(estimator, "out_channels", 80))
    base = (torch.randn(rows, channels, frames, generator=gen), torch.ones(rows, 1, frames),
            torch.randn(rows, channels, frames, generator=gen), torch.rand(rows, generator=gen),
            torch.randn(rows, channels, generator=gen), torch.randn(rows, channels, frames, generator=gen))
    tails = tuple(torch.randn(rows, m.in_channels, m.causal_padding, generator=gen) for m in convs)
    dtype = _torch_dtype(storage)
    shape = [(rows, a.heads, past, a.to_k.out_features // a.heads) for a in attns]
    ks = tuple(torch.randn(*s, generator=gen).to(dtype) for s in shape)
    vs = tuple(torch.randn(*s, generator=gen).to(dtype) for s in shape)
    return base + tails + ks + vs


def export(estimator: Any, target: Any, storage: str) -> None:
    """Write the cached estimator call as an ONNX graph (batch, new frames and past frames dynamic)."""
    convs, attns = _modules(estimator)
    chunk = int(estimator.static_chunk_size)
    args = _dummy(estimator, convs, attns, storage, 2 * chunk, chunk, seed=0)
    names, outs = _names(convs, attns)
    axes: dict[str, dict[int, str]] = {n: {0: "rows", 2: "frames"} for n in ("x", "mask", "mu", "cond", "estimator_out")}
    axes |= {"t": {0: "rows"}, "spks": {0: "rows"}}
    axes |= {n: {0: "rows"} for n in names + outs if n.startswith("conv")}
    axes |= {n: {0: "rows", 2: "past"} for n in names if n[0] in "kv"}
    axes |= {n: {0: "rows", 2: "total"} for n in outs if n[0] in "kv"}
    trace(estimator, _traced(estimator, convs, attns, storage), args, target, names, outs, axes)


@dataclass
class StreamEstimator:
    """One ONNX Runtime session standing in for the hooked torch estimator in the flow cache's ODE."""

    session: Any
    convs: list
    attns: list
    storage: str  # "fp32" | "fp16": the key/value caches' precision
    source: str  # "cache" | "exported" | "memory"
    names: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    frames: int = 0  # estimator frames served (rows of x's length / 2), for benchmarks

    def __call__(self, x: Any, mask: Any, mu: Any, t: Any, spks: Any, cond: Any, stream: Any) -> Any:
        """The estimator's output for the new frames ``x``; reads and replaces ``stream``'s caches of its step."""
        import numpy as np
        import torch

        rows, step = int(x.shape[0]), stream.step
        feed = {n: as_array(v) for n, v in zip(INPUTS, (x, mask, mu, t, spks, cond), strict=True)}
        i = len(INPUTS)
        dtype = np.float16 if self.storage == "fp16" else np.float32
        for m in self.convs:
            tail = stream.conv.get((step, id(m)))
            feed[self.names[i]] = (np.zeros((rows, m.in_channels, m.causal_padding), np.float32)
                                   if tail is None else np.ascontiguousarray(tail.numpy()))
            i += 1
        empty = {}
        for part in (0, 1):
            for a in self.attns:
                cached = stream.kv.get((step, id(a)))
                if cached is None:
                    shape = (rows, a.heads, 0, a.to_k.out_features // a.heads)
                    feed[self.names[i]] = empty.setdefault(shape, np.zeros(shape, dtype))
                else:
                    feed[self.names[i]] = np.ascontiguousarray(cached[part].numpy())
                i += 1
        out = self.session.run(None, feed, run_options())
        n_conv, n_attn = len(self.convs), len(self.attns)
        for j, m in enumerate(self.convs):
            stream.conv[(step, id(m))] = torch.from_numpy(out[1 + j])
        window = stream.window_frames
        for j, a in enumerate(self.attns):
            k, v = out[1 + n_conv + j], out[1 + n_conv + n_attn + j]
            if window is not None and k.shape[2] > window:
                k, v = k[:, :, -window:].copy(), v[:, :, -window:].copy()
            stream.kv[(step, id(a))] = (torch.from_numpy(k), torch.from_numpy(v))
        with self._lock:
            self.frames += int(x.shape[2])
        return torch.from_numpy(out[0]).to(x.dtype)


def check(runner: StreamEstimator, estimator: Any) -> float:
    """Largest relative difference of the output to the hooked torch estimator over a first and a later call."""
    import torch

    from app.engines.cosyvoice.flow.cache import FlowStream, bound_stream

    chunk = int(estimator.static_chunk_size)
    ours, ref = FlowStream(kv_dtype=_torch_dtype(runner.storage)), FlowStream(kv_dtype=_torch_dtype(runner.storage))
    worst = 0.0
    with torch.inference_mode():
        for i, frames in enumerate((chunk + 3, 2 * chunk)):  # a first call (past 0), then one with a past
            args = _dummy(estimator, runner.convs, runner.attns, runner.storage, frames, 0, seed=11 + i)[:len(INPUTS)]
            with bound_stream(ref):
                want = estimator(*args, streaming=True)
            got = runner(*args, stream=ours)
            worst = max(worst, float((got - want).abs().max() / want.abs().max().clamp_min(1e-6)))
    return worst


def load_stream_estimator(estimator: Any, *, cache_dir: str | os.PathLike | None, storage: str = "fp16",
                          threads: int = 1) -> StreamEstimator:
    """The checked stream graph for ``estimator`` (from the cache dir, else a fresh export); OnnxUnavailable
    when it cannot be had. ``install`` of ``flow/cache.py`` must have hooked the estimator first."""
    if storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, not {storage!r}")
    if not getattr(estimator, "_cosyserve_flow_cache", False):
        raise OnnxUnavailable("the estimator is not hooked for the flow cache (flow/cache.py install)")
    convs, attns = _modules(estimator)
    names, _ = _names(convs, attns)
    limit = TOLERANCE if storage == "fp32" else TOLERANCE_REDUCED

    def opened(model: str | bytes, source: str) -> StreamEstimator:
        runner = StreamEstimator(session=open_session(model, threads), convs=convs, attns=attns, storage=storage,
                                 source=source, names=names)
        diff = check(runner, estimator)
        if diff > limit:
            raise OnnxUnavailable(f"the stream graph differs from the hooked estimator by {diff:.1e} of its scale")
        return runner

    return load_graph(key=weights_key(estimator), filename=graph_file(storage), cache_dir=cache_dir,
                      write=lambda f: export(estimator, f, storage), open_graph=opened)


def stream_estimator(flow: Any, levers: Any, storage: str) -> StreamEstimator | None:
    """The flow cache's estimator on ONNX Runtime when the flow's estimator runs there (``levers``: the engine's
    ``Levers``), else None: the hooked torch modules. A graph that cannot be had leaves the streams on torch."""
    from app.engines.cosyvoice.flow.solver import onnx_of

    if onnx_of(flow) is None:
        return None
    try:
        return load_stream_estimator(flow.decoder.estimator, cache_dir=levers.onnx_cache_dir, storage=storage,
                                     threads=levers.threads)
    except Exception as exc:  # noqa: BLE001 - any failure: the cache's streams run on torch
        log.warning("engine.flow_cache: its streams run the flow estimator on torch (%s: %s)", type(exc).__name__, exc)
        return None
