"""The batched request path of a CosyVoice2/3 instance shared by every slot.

One :class:`BatchedRunner` per loaded model: it owns the LLM scheduler thread and
turns one request's model inputs into audio in the calling slot thread:
prompt -> LLM input (here) -> scheduler (shared, batched) -> tokens ->
token2wav with CosyVoice's streaming schedule (here, per request).
Voice conversion has no LLM: its source tokens go straight to token2wav.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from app.engines.base import InvalidInput
from app.engines.batching.flow_cache import FlowStream, supports_flow_cache
from app.engines.batching.flow_cache import install as install_flow_cache
from app.engines.batching.gate import PriorityGate
from app.engines.batching.lm import BatchedLM, supports_batching
from app.engines.batching.sampling import SamplingRules
from app.engines.batching.scheduler import LLMObserver, LLMScheduler
from app.engines.batching.token2wav import FixedTokens, HopSchedule, synthesize_tokens
from app.engines.timings import current

log = logging.getLogger("cosyserve.engine")


class BatchedRunner:
    def __init__(self, model: Any, *, max_batch_size: int, greedy: bool = False,
                 observer: LLMObserver | None = None, initial_hop: int | None = None,
                 trace_logp: bool = False, token2wav_workers: int | None = None,
                 flow_cache: bool = False, flow_cache_window_frames: int | None = None) -> None:
        if not supports_batching(getattr(model, "llm", None)):
            raise TypeError("this CosyVoice model's LLM cannot be batched")
        self.model = model
        self.lm = BatchedLM(model.llm)
        self.schedule = HopSchedule.of(model, initial_hop)
        self.flow_cache = flow_cache and self._can_cache_flow()
        self.flow_cache_window_frames = flow_cache_window_frames
        if self.flow_cache:
            install_flow_cache(model.flow)
        elif flow_cache:
            log.warning("engine.flow_cache: this model's flow or hop schedule cannot be streamed incrementally; "
                        "streaming recomputes the prefix")
        self.scheduler = LLMScheduler(self.lm, max_batch_size=max_batch_size,
                                      rules=SamplingRules.from_llm(model.llm, greedy=greedy),
                                      observer=observer, trace_logp=trace_logp)
        self.gate = PriorityGate(token2wav_workers) if token2wav_workers else None
        self.scheduler.start()

    def _can_cache_flow(self) -> bool:
        """The flow is chunk-causal and every hop starts on a chunk boundary (hops are whole chunks)."""
        flow = self.model.flow
        if not supports_flow_cache(flow):
            return False
        chunk_frames = int(flow.decoder.estimator.static_chunk_size)
        ratio = int(getattr(flow, "token_mel_ratio", 2))
        if chunk_frames % ratio:
            return False
        chunk = chunk_frames // ratio
        s = self.schedule
        hops, hop = {s.hop}, s.hop
        while hop < s.max_hop:
            hop = int(min(s.max_hop, hop * s.scale))
            if hop in hops:
                break
            hops.add(hop)
        return all(h % chunk == 0 for h in hops)

    @property
    def alive(self) -> bool:
        thread = self.scheduler._thread
        return thread is not None and thread.is_alive()

    def close(self) -> None:
        self.scheduler.stop()

    def submit(self, model_input: dict, cancel: threading.Event, seed: int | None = None,
               request_id: str = "") -> Any:
        """Queue one request's LLM work; returns its scheduler sequence (a token source)."""
        import torch

        empty = torch.zeros(1, 0, dtype=torch.int32)
        with torch.inference_mode():
            try:
                lm_input, min_len, max_len = self.lm.prefix(
                    model_input["text"], model_input.get("prompt_text", empty),
                    model_input.get("llm_prompt_speech_token", empty))
            except ValueError as exc:
                raise InvalidInput(str(exc)) from exc
        return self.scheduler.submit(lm_input, min_len, max_len, seed=seed, cancel=cancel, request_id=request_id)

    def run(self, model_input: dict, *, stream: bool, speed: float, cancel: threading.Event,
            seed: int | None = None, request_id: str = "") -> Iterator[Any]:
        """Speech tensors ``[1, n]`` for one segment, as token2wav produces them."""
        if model_input.get("source_speech_token") is not None and model_input["source_speech_token"].shape[1] > 0:
            source: Any = FixedTokens(model_input["source_speech_token"].flatten().tolist())
        else:
            source = self.submit(model_input, cancel, seed=seed, request_id=request_id)
        try:
            flow_stream = FlowStream(window_frames=self.flow_cache_window_frames) if self.flow_cache else None
            yield from synthesize_tokens(self.model, source, model_input, stream=stream, speed=speed,
                                         cancel=cancel, schedule=self.schedule, gate=self.gate,
                                         flow_stream=flow_stream)
        finally:
            if hasattr(source, "cancel"):
                source.cancel()  # leaves the batch at the next step (no-op once done)
            _add_llm_time(source)


def _add_llm_time(source: Any) -> None:
    """The sequence's LLM wall time (submit to last token) into the request's stage timings."""
    timings = current()
    started, ended = getattr(source, "submitted_at", None), getattr(source, "finished_at", None)
    if timings is not None and started is not None and ended is not None:
        timings.add("llm", ended - started)
