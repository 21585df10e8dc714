"""The batched request path of a CosyVoice2/3 instance shared by every slot.

One :class:`BatchedRunner` per loaded model: it owns the LLM scheduler thread and
turns one request's model inputs into audio in the calling slot thread:
prompt -> LLM input (here) -> scheduler (shared, batched) -> tokens ->
token2wav with CosyVoice's streaming schedule (here, per request).
Voice conversion has no LLM: its source tokens go straight to token2wav.
With ``token2wav_batch`` the flow of every request's token2wav calls runs in a second
shared thread, in batched rounds (``flow/scheduler.py``); HiFT stays per request.
A bulk request (``bulk=True``) yields to interactive ones at each LLM step and token2wav
hop (``set_bulk_room``, ``batching/bulk.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from app.engines.base import InvalidInput
from app.engines.cosyvoice.device import ready_event
from app.engines.cosyvoice.flow.batch import BatchedFlow
from app.engines.cosyvoice.flow.budget import FlowCacheBudget, bytes_per_frame
from app.engines.cosyvoice.flow.cache import (
    FlowStream,
    PromptCache,
    prompt_key,
    supports_flow_cache,
)
from app.engines.cosyvoice.flow.cache import install as install_flow_cache
from app.engines.cosyvoice.flow.prefix import PromptRef
from app.engines.cosyvoice.flow.scheduler import FlowObserver, FlowScheduler
from app.engines.cosyvoice.flow.scheduler import install as install_flow_rounds
from app.engines.cosyvoice.llm.bistream import BistreamFeed
from app.engines.cosyvoice.llm.forward import (
    ENDOFPROMPT_ID,
    BatchedLM,
    supports_batching,
)
from app.engines.cosyvoice.llm.observer import LLMObserver
from app.engines.cosyvoice.llm.sampling import SamplingRules
from app.engines.cosyvoice.llm.scheduler import LLMScheduler
from app.engines.cosyvoice.token2wav.gate import PriorityGate
from app.engines.cosyvoice.token2wav.hops import (
    FixedTokens,
    HopSchedule,
    first_hop_bounds,
    synthesize_tokens,
)
from app.engines.timings import current
from app.text.normalize import ClauseNormalizer
from app.text.stream import TextStream, WordBuffer

log = logging.getLogger("cosyserve.engine")
Tokenize = Callable[[str], list[int]]


class BatchedRunner:
    def __init__(self, model: Any, *, max_batch_size: int, greedy: bool = False,
                 observer: LLMObserver | None = None, initial_hop: int | None = None,
                 token2wav_workers: int | None = None,
                 flow_cache: bool = False, flow_cache_precision: str = "fp32",
                 flow_cache_window_frames: int | None = None,
                 flow_prompt_cache_mb: float = 0, flow_cache_budget_mb: float | None = None,
                 token2wav_batch: bool = False, token2wav_max_batch: int | None = None,
                 flow_observer: FlowObserver | None = None, prefill_batch: bool = False) -> None:
        """``flow_cache_budget_mb``: what all streams' flow caches may hold together (None: no limit).
        ``prefill_batch``: the sequences joining at one step are prefilled in one forward (else one by one)."""
        if not supports_batching(getattr(model, "llm", None)):
            raise TypeError("this CosyVoice model's LLM cannot be batched")
        if token2wav_batch and flow_cache:
            raise ValueError("engine.token2wav_batch cannot be combined with engine.flow_cache")
        self.model = model
        self.lm = BatchedLM(model.llm)
        self.schedule = HopSchedule.of(model, initial_hop)
        self.first_hop_bounds = first_hop_bounds(model, self.schedule)
        self.flow_cache = flow_cache and self._can_cache_flow()
        self.flow_cache_window_frames = flow_cache_window_frames
        import torch

        self.flow_cache_dtype = {"fp32": None, "fp16": torch.float16}[flow_cache_precision]
        self.flow_runtime: Any = None  # the flow cache's estimator on ONNX Runtime (onnx_stream.py); None: torch
        self.prompt_cache: PromptCache | None = None
        self.flow_budget: FlowCacheBudget | None = None
        # the voices' prompt states: for the flow cache's streams, or for batched rounds' streamed calls
        prompts = flow_prompt_cache_mb > 0 and (self.flow_cache or (token2wav_batch and supports_flow_cache(model.flow)))
        if prompts:
            self.prompt_cache = PromptCache(int(flow_prompt_cache_mb * 2**20))
        if self.flow_cache:
            install_flow_cache(model.flow)
            if flow_cache_budget_mb is not None:
                size = 2 if self.flow_cache_dtype is not None else 4
                self.flow_budget = FlowCacheBudget(int(flow_cache_budget_mb * 2**20), bytes_per_frame(model.flow, size),
                                                   on_recompute=getattr(observer, "on_flow_cache_recompute", None),
                                                   on_usage=getattr(observer, "on_flow_cache_usage", None))
                self.flow_budget.report()  # the budget is in /metrics before the first stream
        elif flow_cache:
            log.warning("engine.flow_cache: this model's flow or hop schedule cannot be streamed incrementally; "
                        "streaming recomputes the prefix")
        self.scheduler = LLMScheduler(self.lm, max_batch_size=max_batch_size,
                                      rules=SamplingRules.from_llm(model.llm, greedy=greedy),
                                      observer=observer, max_prefill_batch=None if prefill_batch else 1)
        self.flow_rounds: FlowScheduler | None = None
        if token2wav_batch:
            self.flow_rounds = FlowScheduler(BatchedFlow(model.flow, prompts=self.prompt_cache is not None),
                                             max_batch=token2wav_max_batch or max_batch_size,
                                             observer=flow_observer, autocast=_autocast(model))
            install_flow_rounds(model.flow, self.flow_rounds)
        # one flow thread bounds the flow itself; HiFT then runs in the slot threads, ungated
        self.gate = PriorityGate(token2wav_workers) if token2wav_workers and not token2wav_batch else None
        self.scheduler.start()
        if self.flow_rounds is not None:
            self.flow_rounds.start()

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
        if not all(h % chunk == 0 for h in hops):
            return False
        self.schedule = replace(s, chunk=chunk)  # a request's own first hop is rounded up to a chunk end
        return True

    def _prompt_ref(self, model_input: dict, cache_prompt: bool) -> PromptRef | None:
        """A registered voice's place in the prompt cache (content-keyed), for batched streamed calls."""
        if self.prompt_cache is None or self.flow_rounds is None or not cache_prompt:
            return None
        key = prompt_key(model_input.get("flow_prompt_speech_token"), model_input.get("prompt_speech_feat"),
                         model_input.get("flow_embedding"))
        return None if key is None else PromptRef(self.prompt_cache, key)

    def _flow_stream(self, model_input: dict, cache_prompt: bool) -> FlowStream | None:
        """A request's own flow state between hops, when the flow cache is on.

        ``cache_prompt``: the prompt is a registered voice's; its prompt part comes from (or goes
        into) the prompt cache, keyed by a hash of the flow's prompt inputs themselves.
        """
        if not self.flow_cache:
            return None
        stream = FlowStream(window_frames=self.flow_cache_window_frames, budget=self.flow_budget,
                            kv_dtype=self.flow_cache_dtype, runtime=self.flow_runtime)
        if cache_prompt and self.prompt_cache is not None:
            key = prompt_key(model_input.get("flow_prompt_speech_token"), model_input.get("prompt_speech_feat"),
                             model_input.get("flow_embedding"))
            if key is not None:
                stream.prompt_cache, stream.prompt_key = self.prompt_cache, key
        return stream

    def set_bulk_room(self, fn: Callable[[], int | None] | None) -> None:
        """``fn()``: how many bulk requests may compute now (the pool's room); bulk LLM rows step only
        within it, interactive ones always (``batching/bulk.py``). None: no limit."""
        self.scheduler.set_bulk_room(fn)

    @property
    def alive(self) -> bool:
        return self.scheduler.alive and (self.flow_rounds is None or self.flow_rounds.alive)

    def close(self) -> None:
        self.scheduler.stop()
        if self.flow_rounds is not None:
            self.flow_rounds.stop()

    def check_first_hop(self, first_hop: int | None) -> None:
        low, high = self.first_hop_bounds
        if first_hop is not None and not low <= first_hop <= high:
            raise InvalidInput(f"first_chunk_tokens must be between {low} and {high} on this model; got {first_hop}")

    def _stream_kw(self, cancel: threading.Event, request_id: str, first_hop: int | None = None,
                   bulk: bool = False) -> dict:
        return dict(cancel=cancel, schedule=self.schedule.with_first(first_hop), gate=self.gate,
                    batched_flow=self.flow_rounds is not None, request_id=request_id, bulk=bulk)

    def submit(self, model_input: dict, cancel: threading.Event, seed: int | None = None,
               request_id: str = "", bulk: bool = False, since: float | None = None) -> Any:
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
            ready = ready_event(lm_input.device)  # the scheduler's stream waits for it (CUDA)
        return self.scheduler.submit(lm_input, min_len, max_len, seed=seed, cancel=cancel, request_id=request_id,
                                     ready=ready, bulk=bulk, since=since)

    def run(self, model_input: dict, *, stream: bool, speed: float, cancel: threading.Event,
            seed: int | None = None, request_id: str = "", cache_prompt: bool = False,
            first_hop: int | None = None, started: float | None = None, bulk: bool = False) -> Iterator[Any]:
        """Speech tensors ``[1, n]`` for one segment, as token2wav produces them.

        ``first_hop``: the request's own first streamed hop in tokens (``first_hop_bounds``);
        ``started``: when the request began (its place in the token2wav gate and among bulk rows; default: now);
        ``bulk``: the request's class (it yields to interactive work).
        """
        self.check_first_hop(first_hop)
        if model_input.get("source_speech_token") is not None and model_input["source_speech_token"].shape[1] > 0:
            source: Any = FixedTokens(model_input["source_speech_token"].flatten().tolist())
        else:
            source = self.submit(model_input, cancel, seed=seed, request_id=request_id, bulk=bulk, since=started)
        flow_stream = self._flow_stream(model_input, cache_prompt) if stream else None
        try:
            yield from synthesize_tokens(self.model, source, model_input, stream=stream, speed=speed,
                                         flow_stream=flow_stream,
                                         flow_prompt=self._prompt_ref(model_input, cache_prompt),
                                         **self._stream_kw(cancel, request_id, first_hop, bulk), started=started,
                                         seed=seed)
        finally:
            if flow_stream is not None:
                flow_stream.close()  # its cache's bytes go back to the budget
            if hasattr(source, "cancel"):
                source.cancel()  # leaves the batch at the next step (no-op once done)
            _add_llm_time(source)

    def run_bistream(self, model_input: dict, text: TextStream, tokenize: Tokenize, *, cancel: threading.Event,
                     seed: int | None = None, request_id: str = "", system_prompt: str = "",
                     normalize: Callable[[str], str] | None = None,
                     cache_prompt: bool = False, started: float | None = None, bulk: bool = False) -> Iterator[Any]:
        """Speech tensors for text that arrives while it is spoken (CosyVoice2/3 bistream, streamed).

        ``model_input`` holds the prompt (no text); a feeder thread tokenises ``text``'s pieces in
        whole words and hands them to the sequence, which decodes a speech block per 5 text tokens.
        """
        spec = self.lm.spec
        prompt_text = _ids(model_input.get("prompt_text"))
        head: list[int] = []
        if spec.needs_endofprompt:
            if ENDOFPROMPT_ID not in prompt_text:
                prompt_text = tokenize(system_prompt) + prompt_text
            cut = prompt_text.index(ENDOFPROMPT_ID) + 1
            head, prompt_text = prompt_text[:cut], prompt_text[cut:]
        feed = BistreamFeed(speech_token_size=spec.speech_token_size, fill_token=spec.fill_token,
                            mix_ratio=spec.mix_ratio, prompt_text=prompt_text,
                            prompt_speech=_ids(model_input.get("llm_prompt_speech_token")),
                            min_ratio=spec.min_token_text_ratio, max_ratio=spec.max_token_text_ratio, head_text=head)
        seq = self.scheduler.submit_bistream(feed, seed=seed, cancel=cancel, request_id=request_id, bulk=bulk,
                                             since=started)
        stop = threading.Event()
        fed = _Feeder(text, tokenize, feed, seq, stop, normalize)
        thread = threading.Thread(target=fed.run, name="cosyserve-bistream-feed", daemon=True)
        thread.start()
        flow_stream = self._flow_stream(model_input, cache_prompt)
        try:
            yield from synthesize_tokens(self.model, seq, model_input, stream=True, speed=1.0,
                                         flow_stream=flow_stream,
                                         flow_prompt=self._prompt_ref(model_input, cache_prompt),
                                         **self._stream_kw(cancel, request_id, bulk=bulk), started=started,
                                         seed=seed)
        except RuntimeError:
            if fed.empty:
                raise InvalidInput("the utterance has no text to speak") from None
            raise
        finally:
            if flow_stream is not None:
                flow_stream.close()
            stop.set()
            seq.cancel()  # leaves the batch (or its wait for text) at once; no-op once done
            thread.join(2.0)
            _add_llm_time(seq)
        if fed.error is not None:
            raise fed.error


def _autocast(model: Any) -> Any:
    """CosyVoice's fp16 on CUDA is autocast around its token2wav; the flow thread needs its own."""
    if not getattr(model, "fp16", False) or not str(getattr(model, "device", "cpu")).startswith("cuda"):
        return None
    import torch

    return lambda: torch.autocast("cuda", dtype=torch.float16)


def _add_llm_time(source: Any) -> None:
    """The sequence's LLM wall time (submit to last token) into the request's stage timings."""
    timings = current()
    started, ended = getattr(source, "submitted_at", None), getattr(source, "finished_at", None)
    if timings is not None and started is not None and ended is not None:
        timings.add("llm", ended - started)


def _ids(tensor: Any) -> list[int]:
    return [] if tensor is None else [int(t) for t in tensor.flatten().tolist()]


class _Feeder:
    """Text pieces -> whole words -> token ids -> the bistream sequence (in its own thread)."""

    def __init__(self, text: TextStream, tokenize: Tokenize, feed: BistreamFeed, seq: Any,
                 stop: threading.Event, normalize: Callable[[str], str] | None = None) -> None:
        self.text, self.tokenize, self.feed, self.seq, self.stop = text, tokenize, feed, seq, stop
        self.clauses = ClauseNormalizer(normalize) if normalize is not None else None
        self.count = 0
        self.empty = False
        self.error: BaseException | None = None

    def _normalized(self, words: str, final: bool = False) -> str:
        if self.clauses is None:
            return words
        out = self.clauses.feed(words)
        return out + self.clauses.flush() if final else out

    def _push(self, chunk: str) -> None:
        if chunk.strip():
            ids = self.tokenize(chunk)
            self.count += len(ids)
            self.feed.push(ids)

    def run(self) -> None:
        try:
            words = WordBuffer()
            for piece in self.text.pieces(self.stop):
                self._push(self._normalized(words.feed(piece)))
            if self.stop.is_set():
                return
            self._push(self._normalized(words.flush(), final=True))
            if self.count == 0:
                self.empty = True
                self.seq.cancel()
                return
            self.feed.end()
        except BaseException as exc:  # noqa: BLE001 - a tokenizer failure: end the sequence rather than hang it
            self.error = exc
            self.seq.cancel()
