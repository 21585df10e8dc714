"""What one sampled row means for its sequence: the token to hand out, and whether it steps on,
leaves the batch or sits out (a bistream sequence waiting for text). Pure of scheduler state."""

from __future__ import annotations

from typing import Any

from app.engines.cosyvoice.llm.sequence import Sequence

STEP, LEAVE, PARK = "step", "leave", "park"


def next_token(seq: Sequence, logp: Any, spec: Any) -> tuple[int | None, str]:
    """Sample ``seq``'s next token from ``logp`` (its host row): ``(token or None, STEP | LEAVE | PARK)``.

    A stop token ends the sequence without being handed out; the token that reaches the length limit
    is handed out, then the sequence leaves. Bistream: the fill token parks it until more text comes.
    """
    feed = seq.feed
    if feed is not None:
        token = feed.decide(logp, seq.sampler.sample, len(seq.tokens))
        if not feed.final and token == feed.fill:
            return None, PARK
        if token in spec.stop_tokens or token >= spec.speech_token_size:
            return None, LEAVE
        return token, LEAVE if feed.final and len(seq.tokens) + 1 >= feed.max_len else STEP
    if seq.logp_trace is not None:
        seq.logp_trace.append(logp.detach().clone())
    token = seq.sampler.sample(logp, seq.tokens, ignore_eos=len(seq.tokens) < seq.min_len)
    if token in spec.stop_tokens:
        return None, LEAVE
    return token, LEAVE if len(seq.tokens) + 1 >= seq.max_len else STEP
