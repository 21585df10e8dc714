"""An int8 speech-token LLM on a CPU (``engine.llm_quantization: int8``).

CosyVoice2/3 decode speech tokens with a Qwen2 backbone whose decode step is bound by
reading its weights: dynamic int8 quantization of the backbone's ``nn.Linear`` layers
(int8 weights, per-step int8 activations, fp32 accumulation into fp32 outputs) reads a
quarter of the bytes and uses the CPU's int8 dot-product units. Everything around it
stays fp32: the embeddings, the norms, the rotary angles, the attention arithmetic, the
KV cache and the speech-token head (``llm_decoder``), so sampling sees fp32 log-probs.

Implementation: ``torch.ao.quantization.quantize_dynamic`` (fbgemm/x86 kernels). torchao
(0.18.0, its successor) was measured on this project's CPU and is not used: its eager int8
paths run slower than fp32 (a decode step 164 ms vs 79 ms fp32 vs 19 ms here at batch 1) and
are fast only under ``torch.compile``, which a batch of changing size would recompile
(docs/cpu.md). ``quantize_dynamic`` warns that it is deprecated in favour of torchao; we
silence exactly those two messages around the call.

Refused, with a message, where it cannot apply: a CUDA device (use ``engine.dtype`` fp16 or
bf16 there), CosyVoice1's LLM (not a Qwen2 backbone), and an LLM already in bf16.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

log = logging.getLogger("cosyserve.engine")

LLM_QUANTIZATIONS = ("none", "int8")

# The two deprecation messages quantize_dynamic prints (torch 2.13): the API's and the quantized tensor's.
_SILENCED = (r"torch\.ao\.quantization is deprecated",
             r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor creation")


class QuantizationRefused(ValueError):
    """``engine.llm_quantization`` cannot apply to this model on this device (the message says why)."""


def check_llm_quantization(mode: str, *, device_type: str, version: int, llm_dtype: str = "fp32") -> None:
    """Raise :class:`QuantizationRefused` (a clear message) where ``mode`` cannot apply."""
    if mode not in LLM_QUANTIZATIONS:
        raise QuantizationRefused(f"engine.llm_quantization must be one of {', '.join(LLM_QUANTIZATIONS)}, "
                                  f"not {mode!r}")
    if mode == "none":
        return
    if device_type != "cpu":
        raise QuantizationRefused("engine.llm_quantization=int8 is for CPUs (dynamic int8 kernels); on "
                                  f"{device_type.upper()} use engine.dtype fp16 or bf16 instead")
    if version < 2:
        raise QuantizationRefused("engine.llm_quantization=int8 needs a CosyVoice2/3 model (a Qwen2 LLM); "
                                  "CosyVoice1's LLM is not quantized")
    if llm_dtype != "fp32":
        raise QuantizationRefused(f"engine.llm_quantization=int8 quantizes the fp32 LLM; the LLM is set to run in "
                                  f"{llm_dtype} (engine.dtype / dtype_stages): choose one of the two")


def backbone_of(llm: Any) -> Any:
    """The Qwen2 decoder stack of a CosyVoice2/3 LLM (``llm.llm.model.model``), or None."""
    backbone = getattr(getattr(getattr(llm, "llm", None), "model", None), "model", None)
    return backbone if backbone is not None and hasattr(backbone, "layers") else None


def quantize_llm_int8(llm: Any) -> int:
    """Replace the backbone's ``nn.Linear`` layers by dynamic int8 ones, in place; returns how many.

    Quantized: every decoder layer's projections and MLP, and the Qwen text head (``lm_head``),
    whose 151,936 logits CosyVoice's own per-request loop computes every step and never reads
    (the batched path does not run it). Not quantized: the embeddings, the norms and the speech-token
    head ``llm_decoder`` (outside the backbone), so the log-probs sampling sees are computed in fp32
    from the int8 backbone's hidden states.
    """
    import torch
    from torch.ao.quantization import quantize_dynamic

    backbone = backbone_of(llm)
    if backbone is None:
        raise QuantizationRefused(f"{type(llm).__name__} has no Qwen2 backbone to quantize")
    causal_lm = llm.llm.model  # transformers Qwen2ForCausalLM: .model (the backbone), .lm_head
    if "x86" in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = "x86"
    names = {"model.layers"} | ({"lm_head"} if isinstance(getattr(causal_lm, "lm_head", None), torch.nn.Linear) else set())
    before = _linears(causal_lm)
    with warnings.catch_warnings():
        for message in _SILENCED:
            warnings.filterwarnings("ignore", message=message)
        quantize_dynamic(causal_lm, names, dtype=torch.qint8, inplace=True)
    return before - _linears(causal_lm)


def _linears(module: Any) -> int:
    import torch

    return sum(1 for m in module.modules() if type(m) is torch.nn.Linear)
