"""Cost levers applied at load: an int8 LLM, the flow estimator's runtime, ODE steps and CFG.

``apply_levers`` is called once per loaded model (``load.py``, after the weights and the
precision): each setting is resolved for this device and model, refused with a clear
message where it cannot apply (``LeverRefused``), and put in place. What ran is kept in
:class:`AppliedLevers` for the load log line and the benchmarks. docs/cpu.md has the
measurements behind the defaults.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from app.engines.cosyvoice.flow.solver import (
    FlowOptions,
    FlowRuntimeRefused,
    install,
    resolve_flow_runtime,
)
from app.engines.cosyvoice.quantize import (
    QuantizationRefused,
    check_llm_quantization,
    quantize_llm_int8,
)

log = logging.getLogger("cosyserve.engine")


class LeverRefused(ValueError):
    """A setting that cannot apply to this model on this device (the message says which and why)."""


@dataclass(frozen=True)
class Levers:
    """The settings ``engine.llm_quantization``, ``flow_runtime``, ``flow_steps``, ``flow_cfg``, ``onnx_cache_dir``
    (built by app/settings/runtime.py)."""

    llm_quantization: str  # none | int8
    flow_runtime: str  # auto | torch | onnxruntime
    flow_steps: int | None  # None: the model's (10)
    flow_cfg: bool
    onnx_cache_dir: str | None  # where exported ONNX graphs are kept (None: in memory only)
    threads: int  # ONNX Runtime intra-op threads (engine.torch_threads)


@dataclass(frozen=True)
class AppliedLevers:
    llm_int8_layers: int = 0  # Linear layers now dynamic int8 (0: the LLM is as loaded)
    flow: FlowOptions = FlowOptions()

    def describe(self) -> str:
        parts = [f"LLM int8 ({self.llm_int8_layers} linear layers)" if self.llm_int8_layers else "LLM as loaded"]
        runtime = self.flow.runtime + (f" ({self.flow.onnx_source})" if self.flow.onnx_source else "")
        parts.append(f"flow estimator on {runtime}")
        if self.flow.steps is not None:
            parts.append(f"{self.flow.steps} flow steps")
        if not self.flow.cfg:
            parts.append("flow CFG off")
        return ", ".join(parts)


def apply_levers(levers: Levers, *, llm: Any, flow: Any, version: int, device_type: str,
                 llm_dtype: str = "fp32", flow_dtype: str = "fp32", model_dir: Any = None) -> AppliedLevers:
    try:
        check_llm_quantization(levers.llm_quantization, device_type=device_type, version=version, llm_dtype=llm_dtype)
        runtime = resolve_flow_runtime(levers.flow_runtime, device_type=device_type, flow_dtype=flow_dtype)
    except (QuantizationRefused, FlowRuntimeRefused) as exc:
        raise LeverRefused(str(exc)) from exc
    if levers.flow_steps is not None and levers.flow_steps < 1:
        raise LeverRefused(f"engine.flow_steps must be at least 1, not {levers.flow_steps}")
    layers = quantize_llm_int8(llm) if levers.llm_quantization == "int8" else 0
    onnx_est, source = None, None
    if runtime == "onnxruntime":
        onnx_est, runtime = _onnx_estimator(levers, flow, model_dir, explicit=levers.flow_runtime == "onnxruntime")
        source = onnx_est.source if onnx_est is not None else None
    options = FlowOptions(runtime=runtime, steps=levers.flow_steps, cfg=levers.flow_cfg, onnx_source=source)
    install(flow, options, onnx_est)
    return AppliedLevers(llm_int8_layers=layers, flow=options)


def _onnx_estimator(levers: Levers, flow: Any, model_dir: Any, *, explicit: bool) -> tuple[Any, str]:
    """The ONNX estimator, or (None, "torch") with a warning when ``auto`` cannot have it."""
    from app.engines.cosyvoice.flow.onnx import load_onnx_estimator

    try:
        return load_onnx_estimator(flow.decoder.estimator, model_dir=model_dir, cache_dir=levers.onnx_cache_dir,
                                   threads=levers.threads), "onnxruntime"
    except Exception as exc:
        if explicit:
            raise LeverRefused(f"engine.flow_runtime=onnxruntime: no usable ONNX graph of the flow estimator "
                               f"({type(exc).__name__}: {exc})") from exc
        log.warning("engine.flow_runtime=auto: the flow estimator stays on torch (%s: %s)", type(exc).__name__, exc)
        return None, "torch"
