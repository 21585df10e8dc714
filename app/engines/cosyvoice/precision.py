"""Which floating-point precision each CosyVoice stage runs in (``engine.dtype``).

``resolve_precision`` turns the configured ``auto | fp32 | bf16 | fp16`` into what
this host will actually run, with a warning where the request cannot be honoured
or will be slow:

* ``auto``: fp32 everywhere. On a CPU bf16 is only a gain with native bf16 units
  (``avx512_bf16`` / AMX); measured on an AVX2-only EPYC a bf16 Linear is ~5x and a
  bf16 Conv1d ~23-26x slower than fp32 (``python -m bench.bf16_ops``). Choose bf16 yourself
  on a host where ``python -m bench.cost`` shows it pays.
* ``bf16``: the stages in ``engine.dtype_stages`` (default LLM and flow) keep their
  weights in bf16 (autocast would cast the weights on every call, measured slower);
  on a CPU without native bf16 a warning says it is emulated and slow.
* ``fp16``: CUDA only (CosyVoice's own half-precision path); fp32 with a warning on a CPU.

A reduced-precision module is cast once at load and wrapped so its inputs are cast
to its dtype and its outputs back to fp32: the code around it (CosyVoice's sampling,
mel slicing, HiFT's STFT/ISTFT) keeps seeing fp32 tensors.
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


@dataclass(frozen=True)
class Precision:
    dtype: str  # "fp32" | "bf16" | "fp16": what runs
    stages: tuple[str, ...] = ()  # which stages run in it (empty for fp32)
    cuda_fp16: bool = False  # CosyVoice's own fp16 path (model class flag + CUDA autocast)

    @property
    def reduced(self) -> bool:
        return self.dtype != "fp32" and bool(self.stages)

    def stage_dtypes(self) -> dict[str, str]:
        """What each stage runs in, for the load log: ``{"llm": "bf16", "flow": "bf16", "hift": "fp32"}``."""
        return {stage: self.dtype if self.reduced and stage in self.stages else "fp32" for stage in STAGES}


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
    """What ``engine.dtype`` means on this device (``device_type``: "cpu" | "cuda")."""
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
        return Precision("fp16", stages=("llm", "flow"), cuda_fp16=True)
    if device_type == "cpu":
        native = cpu_has_native_bf16() if native_bf16 is None else native_bf16
        if not native:
            log.warning("engine.dtype=bf16: this CPU has no native bf16 (avx512_bf16 or AMX); bf16 is emulated "
                        "here and several times SLOWER than fp32 (see docs/benchmarks/cost.md); use fp32")
    return Precision("bf16", stages=stages)


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

    module.to(dtype)

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
    """Put the chosen stages in bf16 (fp16 on CUDA is CosyVoice's own path: nothing to do here)."""
    if not precision.reduced or precision.cuda_fp16:
        return
    import torch

    dtype = torch.bfloat16
    modules = stage_modules(llm, flow, hift)
    for stage in precision.stages:
        if stage == "llm" and llm is not None:
            _llm_in(llm, dtype)
            continue
        for module in modules[stage]:
            run_in(module, dtype)


def _llm_in(llm: Any, dtype: Any) -> None:
    """The LLM's weights in ``dtype``; its speech-token head hands fp32 logits to sampling.

    The embeddings it builds its input from are in ``dtype`` too, so its inner
    modules need no input casts (CosyVoice's ``inference`` and our batched forward
    both concatenate embedding rows and run the backbone on them).
    """
    llm.to(dtype)

    def to_fp32(_mod: Any, _args: tuple, out: Any) -> Any:
        return out.float()

    def head_in(_mod: Any, args: tuple) -> tuple:
        return _cast(args, dtype)

    llm.llm_decoder.register_forward_pre_hook(head_in)
    llm.llm_decoder.register_forward_hook(to_fp32)
