"""Batched estimator passes whose rows start after a cached prefix: a voice's prompt frames.

CosyVoice2's streaming estimator is chunk-causal (``flow/cache.py`` explains why), so the
frames of a prompt's leading whole chunks depend on the voice alone, and the flow prompt
cache (``flow_cache.PromptCache``) keeps their per-ODE-step state: each causal
convolution's last input frames and each attention layer's keys and values. In a batched
round (``flow/batch.py``) a streamed call of a registered voice then starts after those
frames: its rows run the estimator over the rest only, with

* each causal convolution's left context taken from its call's state (zeros, the
  convolution's own padding, for a row without one);
* each attention layer's keys and values prepended from its call's state, padded to the
  longest prefix of the round and masked per row (all prefix frames are in earlier
  chunks, so every one of them is visible to every new frame).

The hooks act only while a :class:`PrefixRows` is bound in the calling thread (the flow
thread, during such a round); otherwise the modules run as they are. States are read,
never written, so every round and request shares them without copies.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_local = threading.local()
_MASKED = -1.0e10  # CosyVoice's mask_to_bias value for a masked key


@dataclass(frozen=True)
class PromptRef:
    """Where a request's prompt state lives: the voices' prompt cache and this voice's content key."""

    cache: Any  # flow_cache.PromptCache
    key: str


@dataclass
class PrefixRows:
    """The prefix of each call in one batched solve (its rows ``2i``, ``2i + 1``: the CFG pair)."""

    states: list[Any]  # per call: a flow_cache.PromptState, or None
    step: int = 0  # the ODE step now running (selects the state entries)
    _zeros: dict = field(default_factory=dict)

    def keep(self, calls: list[int]) -> None:
        """Only these calls stay in the batch (the others were cancelled)."""
        self.states = [self.states[i] for i in calls]

    def conv_left(self, module: Any, x: Any) -> Any:
        """Each row's left context ``[2B, C, pad]`` for ``module`` (a causal convolution) at this step."""
        import torch

        pad, key = module.causal_padding, (self.step, id(module))
        parts = []
        for state in self.states:
            left = state.conv.get(key) if state is not None else None
            parts.append(left.to(x.dtype) if left is not None else x.new_zeros(2, x.shape[1], pad))
        return torch.cat(parts, dim=0)

    def past(self, module: Any, like: Any) -> tuple[Any, Any, Any] | None:
        """Prefix keys and values ``[2B, H, P, hd]`` (padded to the longest) and their bias ``[2B, P]``."""
        key = (self.step, id(module))
        entries = [state.kv.get(key) if state is not None else None for state in self.states]
        longest = max((e[0].shape[2] for e in entries if e is not None), default=0)
        if longest == 0:
            return None
        rows, heads, _, dim = like.shape
        k = like.new_zeros(rows, heads, longest, dim)
        v = like.new_zeros(rows, heads, longest, dim)
        bias = like.new_full((rows, longest), _MASKED)
        for i, entry in enumerate(entries):
            if entry is None:
                continue
            n = entry[0].shape[2]
            k[2 * i:2 * i + 2, :, :n] = entry[0]
            v[2 * i:2 * i + 2, :, :n] = entry[1]
            bias[2 * i:2 * i + 2, :n] = 0.0
        return k, v, bias


def current() -> PrefixRows | None:
    return getattr(_local, "rows", None)


@contextlib.contextmanager
def bound(rows: PrefixRows | None) -> Iterator[None]:
    previous = current()
    _local.rows = rows
    try:
        yield
    finally:
        _local.rows = previous


class PrefixAttention:
    """An attention processor that, with PrefixRows bound, attends over each row's prefix + its new frames."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None,
                 attention_mask: Any = None, temb: Any = None, *args: Any, **kwargs: Any) -> Any:
        rows = current()
        if rows is None or encoder_hidden_states is not None:
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        import torch

        from app.engines.cosyvoice.flow.cache import attend, project

        b, t, _ = hidden_states.shape
        q, k, v = project(attn, hidden_states)
        bias = attention_mask  # [b, t, t]: the estimator's own chunk and length mask over the new frames
        past = rows.past(attn, k)
        if past is not None:
            pk, pv, pbias = past
            k, v = torch.cat([pk.to(k.dtype), k], dim=2), torch.cat([pv.to(v.dtype), v], dim=2)
            prefix = pbias.to(bias.dtype)[:, None, :].expand(b, t, -1)
            bias = torch.cat([prefix, bias], dim=-1)
        if bias is not None:
            bias = bias.view(b, 1, t, -1)
        return attend(attn, q, k, v, bias, hidden_states)


def _conv_pre(module: Any, args: tuple) -> tuple | None:
    rows = current()
    if rows is None:
        return None
    import torch

    x = args[0]
    return (torch.cat([rows.conv_left(module, x), x], dim=2),)


def _conv_post(module: Any, _args: tuple, out: Any) -> Any:
    return out if current() is None else out[:, :, module.causal_padding:]


def install(flow: Any) -> None:
    """Hook ``flow``'s estimator (CosyVoice2's; ``flow_cache.supports_flow_cache``) for prefixed rows. Idempotent."""
    from app.engines.cosyvoice.flow.cache import hook_estimator

    hook_estimator(flow.decoder.estimator, "_cosyserve_flow_prefix", _conv_pre, _conv_post, PrefixAttention)
