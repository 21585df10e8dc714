"""Speech tokens -> audio for one request, in its slot thread, on CosyVoice's own ``token2wav``.

The schedule is CosyVoice2/3's streaming one (``CosyVoice2Model.tts``), with the
state kept per request instead of on the shared model object:

* the first chunk waits for ``hop + pad`` tokens plus the flow's look-ahead, where
  ``pad`` aligns prompt + first chunk to a multiple of the hop (the small first chunk
  that gives a low time to first audio);
* after each chunk the hop grows by the model's ``stream_scale_factor`` up to
  ``token_max_hop_len`` (models without them keep a fixed hop);
* the rest is finalised in one last call. Without streaming: one call, all tokens.

A request may set its own first hop (``first_chunk_tokens``, within
:func:`first_hop_bounds`): the first chunk then waits for that many tokens plus the
look-ahead, without the alignment pad, and the next hop is the model's first hop plus
the pad that brings later chunk ends back onto multiples of the hop. Only the first
chunk's last frames then lack their chunk's right context: quality traded for time
to first audio. With ``chunk`` set (the flow cache, whose hops must end on whole flow
chunks) the first hop is rounded up to the next chunk end.

Tokens come from a source with ``wait_for(count, timeout)``, ``tokens`` and
``done`` (an LLM scheduler sequence, or a fixed list for voice conversion).
Silent tokens beyond five in a row are dropped, as CosyVoice3's ``llm_job`` does.
"""

from __future__ import annotations

import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from app.engines.cosyvoice.flow.scheduler import (
    FlowCall,
    FlowCancelled,
    bound_call,
)
from app.engines.cosyvoice.token2wav.gate import PriorityGate

MAX_SILENT_RUN = 5
POLL_S = 0.05  # how often a waiting consumer re-checks its cancel flag


@dataclass(frozen=True)
class HopSchedule:
    hop: int
    max_hop: int
    scale: float
    lookahead: int
    first: int | None = None  # a request's own first hop in tokens (None: hop + alignment pad)
    chunk: int = 0  # > 0: every hop must end on a multiple of this many tokens past the prompt start

    @classmethod
    def of(cls, model: Any, initial_hop: int | None = None) -> HopSchedule:
        hop = int(initial_hop or model.token_hop_len)
        return cls(hop=hop, max_hop=int(getattr(model, "token_max_hop_len", hop)),
                   scale=float(getattr(model, "stream_scale_factor", 1)),
                   lookahead=int(model.flow.pre_lookahead_len))

    def with_first(self, first: int | None) -> HopSchedule:
        return self if first is None else replace(self, first=int(first))

    def _grow(self, hop: int) -> int:
        return int(min(self.max_hop, hop * self.scale))

    def hops(self, prompt_tokens: int) -> Iterator[int]:
        """The streamed hops' sizes in tokens, in order (endless: the caller stops)."""
        hop = self.hop
        if self.first is None:
            yield hop + (-prompt_tokens % hop)
        else:
            first = self.first
            if self.chunk:
                first += -(prompt_tokens + first) % self.chunk
            yield first
            yield hop + (-(prompt_tokens + first) % hop)  # later chunk ends back on multiples of the hop
        while True:
            hop = self._grow(hop)
            yield hop


def first_hop_bounds(model: Any, schedule: HopSchedule) -> tuple[int, int]:
    """The first hops (tokens) a request may ask for on ``model``.

    Lowest: the first chunk must give HiFT more mel frames than it holds back for the
    next chunk's overlap (CosyVoice2: ``mel_cache_len``; CosyVoice3: its f0 predictor's
    causal look-right), so that it has audio at all. Highest: the model's largest hop
    (``token_max_hop_len``; the hop itself where the model has no growing schedule).
    """
    ratio = int(getattr(model.flow, "token_mel_ratio", 2))
    held = getattr(model, "mel_cache_len", None)
    if held is None:
        predictor = getattr(getattr(model, "hift", None), "f0_predictor", None)
        first_conv = getattr(predictor, "condnet", [None])[0] if predictor is not None else None
        held = getattr(first_conv, "causal_padding", 0) or 0
    low = max(1, int(held) // ratio + 1)
    return low, max(low, schedule.max_hop)


class FixedTokens:
    """A finished token source (voice conversion: the source speech's tokens)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)
        self.done = True

    def wait_for(self, count: int, timeout: float | None = None) -> int:
        return len(self.tokens)


class SilenceFilter:
    """Keeps at most MAX_SILENT_RUN consecutive silent tokens (a view over the source's tokens)."""

    def __init__(self, silent: Any) -> None:
        self.silent = frozenset(int(t) for t in (silent or ()))
        self.kept: list[int] = []
        self._seen = 0
        self._run = 0

    def update(self, tokens: list[int]) -> list[int]:
        if not self.silent:
            return tokens
        for t in tokens[self._seen:]:
            if t in self.silent:
                self._run += 1
                if self._run > MAX_SILENT_RUN:
                    continue
            else:
                self._run = 0
            self.kept.append(t)
        self._seen = len(tokens)
        return self.kept


def _wait(source: Any, filt: SilenceFilter, need: int, cancel: threading.Event) -> list[int] | None:
    """Block until ``need`` kept tokens exist or the source ended; None if cancelled."""
    while True:
        if cancel.is_set():
            return None
        raw = len(source.tokens)
        done = source.done  # read first: once done, every token is already there
        kept = filt.update(source.tokens)
        if len(kept) >= need or done:
            return kept
        source.wait_for(raw + max(1, need - len(kept)), timeout=POLL_S)


def synthesize_tokens(model: Any, source: Any, inputs: dict, *, stream: bool, speed: float,
                      cancel: threading.Event, schedule: HopSchedule, gate: PriorityGate | None = None,
                      flow_stream: Any = None, batched_flow: bool = False, request_id: str = "",
                      flow_prompt: Any = None, started: float | None = None, bulk: bool = False,
                      seed: int | None = None) -> Iterator[Any]:
    """Yield speech tensors ``[1, n]`` as ``model.token2wav`` makes them from ``source``'s tokens.

    ``gate`` (optional) bounds concurrent token2wav calls across requests, oldest request first;
    ``started`` is when the request began (``time.monotonic()``; default: now), the same for
    every segment of one request, so a later segment keeps its request's place.
    ``flow_stream`` (optional, streaming only): a ``flow_cache.FlowStream`` bound around each
    call, so the flow computes each hop's new frames only (``app/engines/cosyvoice/flow/cache.py``).
    ``batched_flow``: the model's flow is routed to a ``FlowScheduler`` (``flow_scheduler.install``);
    each call is bound with this request's priority and cancel flag, and no gate is used.
    ``flow_prompt`` (batched flow only): a ``flow_prefix.PromptRef``, the voice's cached prompt state.
    ``bulk``: the request's traffic class; its calls go after waiting interactive ones (gate and rounds).
    ``seed``: the request's seed; its token2wav calls then draw their noise from their own generator
    (``noise.py``), so the same seeded request gives the same audio alone or beside others.
    """
    import torch

    from app.engines.cosyvoice.flow.cache import bound_stream
    from app.engines.cosyvoice.token2wav.noise import noise_generator, request_noise

    started = time.monotonic() if started is None else started
    calls = 0
    cached = flow_stream if stream else None
    generator = None if seed is None else noise_generator(seed)

    def token2wav(**kw: Any) -> Any:
        nonlocal calls
        index, calls = calls, calls + 1
        with bound_stream(cached), request_noise(generator):
            if batched_flow:
                try:
                    call = FlowCall(first=index == 0, started=started, cancel=cancel, request_id=request_id,
                                    prompt=flow_prompt, bulk=bulk)
                    with bound_call(call):
                        return model.token2wav(**kw)
                except FlowCancelled:
                    return None
            if gate is None:
                return model.token2wav(**kw)
            if not gate.acquire(index, started, cancel, bulk=bulk):
                return None
            try:
                return model.token2wav(**kw)
            finally:
                gate.release()

    this_uuid = str(uuidlib.uuid4())
    prompt_token = inputs.get("flow_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32))
    common = dict(prompt_token=prompt_token,
                  prompt_feat=inputs.get("prompt_speech_feat", torch.zeros(1, 0, 80)),
                  embedding=inputs.get("flow_embedding", torch.zeros(0, 192)), uuid=this_uuid)
    filt = SilenceFilter(getattr(model, "silent_tokens", None))
    with model.lock:
        model.hift_cache_dict[this_uuid] = None
    try:
        with torch.inference_mode():
            offset = 0
            if stream:
                for this_hop in schedule.hops(int(prompt_token.shape[1])):
                    need = offset + this_hop + schedule.lookahead
                    kept = _wait(source, filt, need, cancel)
                    if kept is None:
                        return
                    if len(kept) < need:  # the source ended: the rest goes in the final call
                        break
                    chunk = torch.tensor(kept[:need], dtype=torch.int32).unsqueeze(0)
                    speech = token2wav(token=chunk, token_offset=offset, stream=True, finalize=False, **common)
                    if speech is None:
                        return
                    yield speech
                    offset += this_hop
            kept = _wait(source, filt, 1 << 62, cancel)
            if kept is None:
                return
            if not kept:
                raise RuntimeError("the LLM produced no speech tokens")
            tokens = torch.tensor(kept, dtype=torch.int32).unsqueeze(0)
            # CosyVoice's last call is a non-streaming one, also after a stream
            speech = token2wav(token=tokens, token_offset=offset, stream=False, finalize=True,
                               speed=1.0 if stream else speed, **common)
            if speech is not None:
                yield speech
    finally:
        with model.lock:
            model.hift_cache_dict.pop(this_uuid, None)
