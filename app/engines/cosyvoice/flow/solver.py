"""What runs the flow's ODE: the estimator's runtime, the number of steps, classifier-free guidance.

CosyVoice's flow turns tokens into a mel with a conditional flow-matching ODE (the CFM
``flow.decoder``): ``n_timesteps`` (10) Euler steps, each one estimator pass over two rows,
the conditioned one and an unconditioned one for classifier-free guidance (CFG, rate
``inference_cfg_rate``, 0.7). Three settings act on it:

* ``engine.flow_runtime`` (``auto | torch | onnxruntime``): the estimator on ONNX Runtime
  (``flow/onnx.py``) for every call its graph serves, torch for the rest. Exact to float
  rounding. ``auto``: ONNX Runtime on a CPU with an fp32 flow, torch on CUDA or with a
  bf16/fp16 flow (docs/cpu.md has the measurements).
* ``engine.flow_steps`` (default: the model's, 10): fewer Euler steps, proportionally less
  estimator work. Changes the audio.
* ``engine.flow_cfg`` (default true): false drops the unconditioned row (half the estimator
  work per step) and its guidance. Changes the audio.

The ONNX estimator replaces the CFM's ``forward_estimator`` (the one place upstream's Euler
solver calls the network); steps and CFG replace its ``solve_euler`` with ours, only when one
of them differs from the model's. The flow cache (``flow/cache.py``) runs its own
solver on the torch modules (it keeps per-layer state between hops, which one opaque graph
cannot): it reads the steps and CFG from :func:`options_of`, and stays on torch.
"""

from __future__ import annotations

import logging
import math
import types
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("cosyserve.engine")

FLOW_RUNTIMES = ("auto", "torch", "onnxruntime")
MODEL_STEPS = 10  # CosyVoice's flow.inference passes n_timesteps=10 (v1, v2, v3)
_ATTR = "cosyserve_flow_options"


@dataclass(frozen=True)
class FlowOptions:
    runtime: str = "torch"  # what runs the estimator: torch | onnxruntime
    steps: int | None = None  # Euler steps (None: the model's)
    cfg: bool = True  # classifier-free guidance (two estimator rows per step)
    onnx_source: str | None = None  # where the ONNX graph came from (model dir | cache | exported | memory)

    @property
    def changes_solver(self) -> bool:
        return not self.cfg or (self.steps is not None and self.steps != MODEL_STEPS)


class FlowRuntimeRefused(ValueError):
    """The flow setting cannot apply to this model on this device (the message says why)."""


def resolve_flow_runtime(value: str, *, device_type: str, flow_dtype: str = "fp32") -> str:
    """``auto | torch | onnxruntime`` -> what runs here (torch | onnxruntime); refuses what cannot."""
    if value not in FLOW_RUNTIMES:
        raise FlowRuntimeRefused(f"engine.flow_runtime must be one of {', '.join(FLOW_RUNTIMES)}, not {value!r}")
    if value == "torch":
        return "torch"
    cpu_fp32 = device_type == "cpu" and flow_dtype == "fp32"
    if value == "auto":
        return "onnxruntime" if cpu_fp32 else "torch"
    if device_type != "cpu":
        raise FlowRuntimeRefused(f"engine.flow_runtime=onnxruntime runs the flow estimator on the CPU; on "
                                 f"{device_type.upper()} use torch (engine.dtype fp16/bf16 for speed)")
    if flow_dtype != "fp32":
        raise FlowRuntimeRefused(f"engine.flow_runtime=onnxruntime runs an fp32 estimator; the flow is set to "
                                 f"{flow_dtype} (engine.dtype / dtype_stages): choose one of the two")
    return "onnxruntime"


def options_of(cfm: Any) -> FlowOptions:
    """The flow options installed on a CFM (defaults if none)."""
    return getattr(cfm, _ATTR, None) or FlowOptions()


def time_grid(cfm: Any, steps: int, device: Any, dtype: Any) -> Any:
    """The ODE's times 0..1 in ``steps`` steps, with the CFM's scheduler (cosine in CosyVoice2/3)."""
    import torch

    grid = torch.linspace(0, 1, steps + 1, device=device, dtype=dtype)
    if getattr(cfm, "t_scheduler", "") == "cosine":
        grid = 1 - torch.cos(grid * 0.5 * math.pi)
    return grid


def solve(cfm: Any, x: Any, t_span: Any, mu: Any, mask: Any, spks: Any, cond: Any, streaming: bool = False,
          *, steps: int | None = None, cfg: bool = True) -> Any:
    """Euler steps over the CFM's estimator, with or without classifier-free guidance.

    Same arithmetic as CosyVoice's ``solve_euler`` (guided: ``(1 + r) * d_cond - r * d_uncond``,
    the unconditioned row with zero ``mu``, speaker and prompt condition), for any batch.
    """
    import torch

    if steps is not None and steps != len(t_span) - 1:
        t_span = time_grid(cfm, steps, x.device, x.dtype)
    b, rows = x.shape[0], (2 if cfg else 1) * x.shape[0]
    rate = float(cfm.inference_cfg_rate)

    def stacked(value: Any, shape: tuple) -> Any:
        out = torch.zeros((rows, *shape), device=x.device, dtype=x.dtype)
        if value is not None:
            out[:b] = value
        return out

    mu_in = stacked(mu, tuple(mu.shape[1:]))
    cond_in = stacked(cond, tuple(mu.shape[1:]))
    spks_in = stacked(spks, (spks.shape[1],) if spks is not None else (mu.shape[1],))
    mask_in = torch.cat([mask] * (rows // b), dim=0).to(x.dtype)
    t, dt = t_span[0], t_span[1] - t_span[0]
    for step in range(1, len(t_span)):
        x_in = torch.cat([x] * (rows // b), dim=0)
        t_in = t.reshape(1).expand(rows).to(x.dtype)
        d = cfm.forward_estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming)
        if cfg:
            d = (1.0 + rate) * d[:b] - rate * d[b:]
        x = x + dt * d
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return x.float()


def install(flow: Any, options: FlowOptions, onnx_estimator: Any = None) -> FlowOptions:
    """Put ``options`` in place on ``flow.decoder`` (the CFM); returns them (recorded for ``options_of``)."""
    cfm = flow.decoder
    if onnx_estimator is not None:
        torch_forward = cfm.forward_estimator

        def forward_estimator(x: Any, mask: Any, mu: Any, t: Any, spks: Any, cond: Any, streaming: bool = False) -> Any:
            if onnx_estimator.serves(int(x.shape[0]), bool(streaming)):
                return onnx_estimator(x, mask, mu, t, spks, cond, streaming=streaming)
            return torch_forward(x, mask, mu, t, spks, cond, streaming)

        forward_estimator.onnx = onnx_estimator  # type: ignore[attr-defined]
        cfm.forward_estimator = forward_estimator
    if options.changes_solver:
        steps, cfg = options.steps, options.cfg

        def solve_euler(self: Any, x: Any, t_span: Any, mu: Any, mask: Any, spks: Any, cond: Any,
                        streaming: bool = False) -> Any:
            return solve(self, x, t_span, mu, mask, spks, cond, streaming, steps=steps, cfg=cfg)

        cfm.solve_euler = types.MethodType(solve_euler, cfm)
    setattr(cfm, _ATTR, options)
    return options


def onnx_of(flow: Any) -> Any:
    """The ONNX estimator installed on ``flow`` (None: the estimator runs in torch)."""
    return getattr(getattr(flow.decoder, "forward_estimator", None), "onnx", None)
