"""Full-size random-weight CosyVoice2: real dimensions, a bounded number of speech tokens.

``cosyserve make-tiny-model --version 2 --full-size OUT`` (``tiny.build_tiny_model(...,
full_size=True)``) writes a model dir with CosyVoice2-0.5B's shapes: a Qwen2 backbone of
Qwen2.5-0.5B's size (``QWEN2_05B``) and the real flow / HiFT sizes
(``configs.V2_SIZES["full"]``). It exists to measure serving designs (batching, memory,
threads) at the cost a real model has, without the real weights. The audio is noise.

Random weights never end a sequence. ``calibrate_decoder`` makes the stop predictable:
the output head's speech logits are scaled almost flat, the end-of-speech logit gets a
constant bias, and Qwen2LM's two other stop/fill ids are pushed far down. Inside
CosyVoice's sampler (top-k 25 / top-p 0.8 nucleus) end-of-speech then takes a share
``EOS_SHARE`` of the nucleus at every step:

* before the minimum length (2x the text tokens) CosyVoice either masks end-of-speech
  (upstream HEAD) or resamples while it is drawn (the PyPI copy, up to 100 tries): with a
  share of 0.85 a run of 101 draws of it has probability ~7e-8 per step, so neither raises;
* from the minimum on, the first draw is end-of-speech with probability 0.85, so a request
  yields ``int(2 * text_tokens)`` speech tokens, plus one with p ~0.13, plus two or more
  with p ~0.02.

A share of 1 would stop exactly, but the PyPI copy's resampling would then raise before
the minimum; a share much below 0.85 spreads the count.
"""

from __future__ import annotations

import math
from typing import Any

# Qwen2.5-0.5B (CosyVoice2-0.5B's LLM backbone, CosyVoice-BlankEN/config.json).
QWEN2_05B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
EOS_SHARE = 0.85  # end-of-speech's share of the sampler's nucleus at every step
DECODER_SCALE = 0.02  # speech logits: random head x this (std ~0.02 after the final RMSNorm: nearly flat)
TOP_K = 25  # CosyVoice2's ras_sampling top_k (the yaml's sampling block)


def eos_bias(share: float = EOS_SHARE, top_k: int = TOP_K) -> float:
    """EOS logit that gives end-of-speech ``share`` of a top-k nucleus of flat (logit 0) speech tokens.

    Speech logits near 0 make the top-p 0.8 cut never bind (6561 tokens of ~equal
    weight): the nucleus is EOS plus the ``top_k - 1`` best speech tokens, each of
    weight ~1, so share = e^b / (e^b + top_k - 1).
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1), got {share!r}")
    return math.log(share / (1.0 - share) * (top_k - 1))


def expected_tokens(text_tokens: int, share: float = EOS_SHARE, ratio: float = 2.0) -> float:
    """Mean speech tokens per request: the minimum, then geometric with stop probability ``share``."""
    return int(text_tokens * ratio) + (1.0 - share) / share


def qwen_config(tokenizer_vocab: int, eos_token_id: int) -> Any:
    """The Qwen2 config: Qwen2.5-0.5B's shape, stored in bf16 like the real CosyVoice-BlankEN."""
    from transformers import Qwen2Config

    if tokenizer_vocab > QWEN2_05B["vocab_size"]:
        raise ValueError(f"tokenizer has {tokenizer_vocab} ids, more than the Qwen vocabulary")
    return Qwen2Config(**QWEN2_05B, eos_token_id=eos_token_id, dtype="bfloat16")


def calibrate_decoder(llm: Any, gen: Any, share: float = EOS_SHARE, scale: float = DECODER_SCALE) -> None:
    """Make ``llm`` (a Qwen2LM) stop right after CosyVoice's minimum length (see the module doc)."""
    import torch

    dec = llm.llm_decoder
    n = llm.speech_token_size
    if dec.weight.shape[0] != n + 3:
        raise ValueError(f"expected a Qwen2LM head of {n + 3} rows, got {tuple(dec.weight.shape)}")
    with torch.no_grad():
        bound = scale / dec.weight.shape[1] ** 0.5
        dec.weight.copy_((torch.rand(dec.weight.shape, generator=gen) * 2.0 - 1.0) * bound * 3**0.5)
        dec.weight[n:] = 0.0
        dec.bias.zero_()
        dec.bias[n] = eos_bias(share)
        dec.bias[n + 1 :] = -100.0  # the other stop id and the bistream fill token never win
