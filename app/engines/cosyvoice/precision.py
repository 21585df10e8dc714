"""Which floating-point precision each CosyVoice stage runs in (``engine.dtype``).

``resolve_precision`` turns the configured ``auto | fp32 | bf16 | fp16`` into what
this host will actually run, with a warning where the request cannot be honoured
or will be slow:

* ``auto``: fp32 everywhere. On a CPU bf16 is only a gain with native bf16 units
  (``avx512_bf16`` / AMX); measured on an AVX2-only EPYC a bf16 Linear is ~5x and a
  bf16 Conv1d ~23-26x slower than fp32 (study ``bench/studies/2026-12-01-bf16-ops/`` at commit 3873904,
  removed from the tree since). Choose bf16 yourself on a host where
  ``python -m bench cost --variants defaults,bf16`` shows it pays.
* ``bf16``: the stages in ``engine.dtype_stages`` (default LLM and flow) keep their
  weights in bf16 (autocast would cast the weights on every call, measured slower);
  on a CPU without native bf16 a warning says it is emulated and slow.
* ``fp16``: CUDA only; fp32 with a warning on a CPU. The LLM (weights, KV cache of the
  batched decoder) runs in half precision: bf16 where the GPU computes it (compute
  capability 8.0+: the same memory as fp16 and fp32's range, so no overflow), else fp16;
  the log says which. Attention softmax and the log-probs stay fp32. The flow runs as
  upstream runs it, under CUDA autocast fp16 (fp32 weights, fp16 matmuls). HiFT stays
  fp32 (upstream's CosyVoice3 token2wav autocasts it too; its STFT/ISTFT want fp32).
  CosyVoice's own ``fp16`` model flag is never set: it would ``.half()`` the flow in some
  copies and autocast HiFT in v3, and the batched path does not go through it anyway.

A reduced-precision module is cast once at load and wrapped so its inputs are cast
to its dtype and its outputs back to fp32: the code around it (CosyVoice's sampling,
mel slicing, HiFT's STFT/ISTFT) keeps seeing fp32 tensors. Rotary frequencies
(``inv_freq`` buffers) stay fp32 whatever the weights' dtype: in bf16 they are off by
0.4%, and the angle ``position x inv_freq`` is then off by up to 1.9 rad at position 2047.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("cosyserve.engine")

DTYPES = ("auto", "fp32", "bf16", "fp16")
STAGES = ("llm", "flow", "hift")
DEFAULT_STAGES = ("llm", "flow")  # HiFT stays fp32: ~7% of a request, and its STFT/ISTFT need fp32
_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


ROTARY_BUFFERS = ("inv_freq", "original_inv_freq")  # kept fp32 in any cast module


@dataclass(frozen=True)
class Precision:
    dtype: str  # "fp32" | "bf16" | "fp16": what runs
    stages: tuple[str, ...] = ()  # which stages run in it (empty for fp32)
    llm_dtype: str = ""  # fp16 on CUDA: the LLM's half type, "bf16" where the GPU has it, else "fp16"

    @property
    def reduced(self) -> bool:
        return self.dtype != "fp32" and bool(self.stages)

    def stage_dtypes(self) -> dict[str, str]:
        """What each stage runs in, for the load log: ``{"llm": "bf16", "flow": "bf16", "hift": "fp32"}``."""
        out = {stage: self.dtype if self.reduced and stage in self.stages else "fp32" for stage in STAGES}
        if self.dtype == "fp16" and self.reduced:
            if "llm" in self.stages:
                out["llm"] = self.llm_dtype or "fp16"
            if "flow" in self.stages:
                out["flow"] = "fp16 autocast"
        return out


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """True if this CPU computes bf16 in hardware (oneDNN's own check, else /proc/cpuinfo flags)."""
    if flags is None:
        try:
            import torch

            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (ImportError, AttributeError, RuntimeError):
            flags = cpu_flags()
    return any(f in flags for f in _BF16_CPU_FLAGS)


def resolve_precision(dtype: str, device_type: str, stages: tuple[str, ...] | list[str] = DEFAULT_STAGES,
                      *, native_bf16: bool | None = None) -> Precision:
    """What ``engine.dtype`` means on this device (``device_type``: "cpu" | "cuda").

    ``native_bf16``: whether the device computes bf16 natively (default: ask the CPU or the GPU).
    """
    if dtype not in DTYPES:
        raise ValueError(f"engine.dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"engine.dtype_stages: unknown stage(s) {unknown}; use {', '.join(STAGES)}")
    stages = tuple(s for s in STAGES if s in stages)
    if dtype in ("auto", "fp32") or not stages:
        return Precision("fp32")
    if dtype == "fp16":
        if device_type != "cuda":
            log.warning("engine.dtype=fp16 needs a CUDA device; running fp32 on the CPU (bf16 is the CPU option)")
            return Precision("fp32")
        if "hift" in stages:
            log.warning("engine.dtype=fp16: HiFT stays fp32 (its STFT/ISTFT and the waveform need it)")
        half = tuple(s for s in stages if s != "hift")
        if not half:
            return Precision("fp32")
        bf16 = _cuda_bf16() if native_bf16 is None else native_bf16
        if "llm" in half:
            log.info("engine.dtype=fp16: the LLM runs in %s (%s), flow under fp16 autocast, HiFT in fp32",
                     "bf16" if bf16 else "fp16",
                     "this GPU computes bf16: fp16's memory with fp32's range" if bf16 else "no bf16 on this GPU")
        return Precision("fp16", stages=half, llm_dtype="bf16" if bf16 else "fp16")
    if device_type == "cpu":
        native = cpu_has_native_bf16() if native_bf16 is None else native_bf16
        if not native:
            log.warning("engine.dtype=bf16: this CPU has no native bf16 (avx512_bf16 or AMX); bf16 is emulated "
                        "here and several times SLOWER than fp32 (see docs/benchmarks/cost.md); use fp32")
    return Precision("bf16", stages=stages)


def _cuda_bf16() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    except (ImportError, RuntimeError):
        return False


def cast_module(module: Any, dtype: Any) -> Any:
    """``module.to(dtype)``, except rotary frequency buffers (``inv_freq``), which stay fp32."""
    import torch

    keep = []
    for sub in module.modules():
        for name in ROTARY_BUFFERS:
            value = getattr(sub, name, None)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                keep.append((sub, name, value.detach().to(torch.float32, copy=True)))
    module.to(dtype)
    for sub, name, value in keep:
        setattr(sub, name, value)  # a registered buffer stays one (Module.__setattr__), now fp32 again
    return module


def _cast(value: Any, dtype: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, tuple):
        return tuple(_cast(v, dtype) for v in value)
    return value


def run_in(module: Any, dtype: Any) -> Any:
    """Cast ``module``'s weights to ``dtype`` once; its float inputs go in as ``dtype``, outputs come out fp32."""
    import torch

    cast_module(module, dtype)

    def before(_mod: Any, args: tuple, kwargs: dict) -> tuple:
        return _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}

    def after(_mod: Any, _args: tuple, _kwargs: dict, out: Any) -> Any:
        return _cast(out, torch.float32)

    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after, with_kwargs=True)
    return module


def stage_modules(llm: Any, flow: Any, hift: Any) -> dict[str, list[Any]]:
    """The compute-heavy modules of each stage (what runs in reduced precision).

    LLM: the whole module (embeddings, Qwen2 backbone, speech-token head; the head's
    output is cast back to fp32 before sampling). Flow: the token encoder and the
    CFM estimator (input embedding, speaker projection and the ODE loop stay fp32).
    HiFT: its convolution stacks one by one (``decode``'s STFT/ISTFT run between
    them and stay fp32).
    """
    out: dict[str, list[Any]] = {"llm": [], "flow": [], "hift": []}
    if llm is not None:
        out["llm"] = [llm]
    for name in ("encoder",):
        if getattr(flow, name, None) is not None:
            out["flow"].append(getattr(flow, name))
    estimator = getattr(getattr(flow, "decoder", None), "estimator", None)
    if estimator is not None:
        out["flow"].append(estimator)
    if hift is not None:
        out["hift"] = list(_hift_networks(hift))
    return out


def _hift_networks(hift: Any) -> Any:
    """HiFT's convolution stacks (``decode`` calls them as modules between its STFT and ISTFT).

    ``m_source`` (the sine/noise excitation, random noise in fp32) and parameter-free
    modules (upsampling, padding) stay as they are.
    """
    import torch

    for name, child in hift.named_children():
        if name == "m_source":
            continue
        items = list(child) if isinstance(child, torch.nn.ModuleList) else [child]
        for item in items:
            if any(True for _ in item.parameters()):
                yield item


def apply_precision(precision: Precision, llm: Any, flow: Any, hift: Any) -> None:
    """Put the chosen stages in their reduced precision (see the module docstring)."""
    if not precision.reduced:
        return
    import torch

    modules = stage_modules(llm, flow, hift)
    if precision.dtype == "fp16":  # CUDA: LLM half (bf16 where the GPU has it), flow autocast fp16, HiFT fp32
        if "llm" in precision.stages and llm is not None:
            llm_in(llm, torch.bfloat16 if precision.llm_dtype == "bf16" else torch.float16)
        if "flow" in precision.stages:
            for module in modules["flow"]:
                autocast_in(module, torch.float16)
        return
    dtype = torch.bfloat16
    for stage in precision.stages:
        if stage == "llm" and llm is not None:
            llm_in(llm, dtype)
            continue
        for module in modules[stage]:
            run_in(module, dtype)


def autocast_in(module: Any, dtype: Any) -> Any:
    """Run ``module``'s forward under autocast to ``dtype`` on its own device (its weights stay fp32);
    float outputs come out fp32, as upstream's flow hands fp32 mel to HiFT."""
    import torch

    device_type = next(module.parameters()).device.type
    forward = module.forward

    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            out = forward(*args, **kwargs)
        return _cast(out, torch.float32)

    module.forward = autocast_forward
    return module


def llm_in(llm: Any, dtype: Any) -> None:
    """The LLM's weights in ``dtype`` (rotary frequencies fp32); its speech-token head hands fp32 logits to sampling.

    The embeddings it builds its input from are in ``dtype`` too, so its inner
    modules need no input casts (CosyVoice's ``inference`` and our batched forward
    both concatenate embedding rows and run the backbone on them). Our batched
    decoder's KV cache takes the head's dtype (``BatchedLM.dtype``).
    """
    cast_module(llm, dtype)

    def to_fp32(_mod: Any, _args: tuple, out: Any) -> Any:
        return out.float()

    def head_in(_mod: Any, args: tuple) -> tuple:
        return _cast(args, dtype)

    llm.llm_decoder.register_forward_pre_hook(head_in)
    llm.llm_decoder.register_forward_hook(to_fp32)
