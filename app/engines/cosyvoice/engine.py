"""CosyVoiceEngine: the Engine contract over the real CosyVoice classes (v1, v2, v3).

``load`` builds the model dir with the real classes (``load.py``) and reads everything
the serving layer may ask later (``EngineInfo``, preset speakers, the voice family) once,
in the slot thread. ``synthesize`` turns a request into model inputs (``inputs.py``) and
speaks each segment through the batched LLM (``batched.py``) when it is on, else through
CosyVoice's own ``tts()`` with our cancellation (``cancel.py``). This package is the only
place that imports torch or CosyVoice.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from app.engines.base import (
    PROMPT_RATE,
    AudioChunk,
    EngineFailure,
    EngineInfo,
    InvalidInput,
    PromptAudio,
    SynthesisRequest,
    check_mode_inputs,
    float_to_int16,
)
from app.engines.cosyvoice import prompts
from app.engines.cosyvoice.config import CosyVoiceConfig
from app.engines.cosyvoice.inputs import ModelInputs
from app.engines.cosyvoice.voices import (
    PromptFrontend,
    VoiceFeatures,
    registered_voice,
    voice_family,
)
from app.engines.timings import bound_iter, current, instrument
from app.text.normalize import TextNormalizer
from app.text.segments import StreamSegments, segment_texts, speakable

__all__ = ["CosyVoiceConfig", "CosyVoiceEngine", "VoiceFeatures"]

log = logging.getLogger("cosyserve.engine")

_BISTREAM_MODES = ("sft", "zero_shot", "cross_lingual", "instruct2")


def _bulk(req: SynthesisRequest) -> bool:
    """The request is of the bulk class (``SynthesisRequest.priority``): it yields to interactive work."""
    return str(req.priority).lower() == "bulk"


def _precision_text(precision: Any) -> str:
    return ", ".join(f"{stage} {dtype}" for stage, dtype in precision.stage_dtypes().items())


class CosyVoiceEngine:
    def __init__(self, config: CosyVoiceConfig, name: str | None = None, llm_observer: Any = None) -> None:
        self.config = config
        self.llm_observer = llm_observer  # LLMObserver: batch sizes, step times, tokens (metrics)
        self.name = name or os.path.basename(os.path.normpath(config.model_dir))
        self.sample_rate = 0
        self.normalizer = TextNormalizer(config.text_normalization)
        # set by load(), read-only afterwards
        self.loaded: Any = None  # load.LoadedModel
        self.runner: Any = None  # batched.BatchedRunner when the LLM is batched across requests
        self.prompts: PromptFrontend | None = None
        self.inputs: ModelInputs | None = None
        self.cancels: Any = None
        self._initial_hop: int | None = None
        self._info: EngineInfo | None = None
        self._bulk_room: Any = None  # the pool's room for bulk requests (set_bulk_room), applied at load
        self._speakers: tuple[str, ...] = ()

    # -- lifecycle ------------------------------------------------------------------------------
    def load(self) -> None:
        import torch

        from app.engines.cosyvoice.cancel import CancelRegistry
        from app.engines.cosyvoice.device import device_text, resolve_device
        from app.engines.cosyvoice.layout import (
            CAMPPLUS,
            SPEECH_TOKENIZER_FILES,
            files_fingerprint,
        )
        from app.engines.cosyvoice.load import load_model_dir

        resolve_device(self.config.device)  # a missing GPU fails here, before the slow parts
        torch.set_num_threads(max(1, int(self.config.torch_threads)))
        t0 = time.perf_counter()
        self.normalizer.load()
        lm = load_model_dir(self.config.model_dir, dtype=self.config.dtype,
                            dtype_stages=tuple(self.config.dtype_stages), cosyvoice_path=self.config.cosyvoice_path,
                            device=self.config.device, levers=self.config.levers,
                            llm_weights=self.config.llm_weights)
        if self.config.batching and lm.version < 2:
            raise EngineFailure(f"engine.batching needs a CosyVoice2/3 model; {lm.model_dir} is CosyVoice1")
        self.loaded = lm
        self.cancels = CancelRegistry(lm.model, observer=self.llm_observer)
        self.sample_rate = lm.sample_rate
        self._initial_hop = getattr(lm.model, "token_hop_len", None)
        family = f"cosyvoice{lm.version}"
        self.prompts = PromptFrontend(lm.frontend, voice_family(family, [lm.model_dir / CAMPPLUS,
                                                                         lm.model_dir / SPEECH_TOKENIZER_FILES[lm.version]]),
                                      self.sample_rate, self.config.prompt_cache_size)
        self.inputs = ModelInputs(lm.frontend, lm.version, self.prompts, self.normalizer,
                                  self.config.max_segment_chars, self.config.max_segment_tokens)
        if self.config.llm_greedy and lm.version >= 2:
            from app.engines.cosyvoice.llm.sampling import ranked_greedy

            lm.model.llm.sampling = ranked_greedy()  # testing: deterministic per-request decoding
        if self.config.batching:
            from app.engines.cosyvoice.batched import BatchedRunner
            from app.engines.cosyvoice.flow.budget import budget_mb
            from app.engines.cosyvoice.flow.onnx_stream import stream_estimator

            cached, budget = self._flow_cache(), self.config.flow_cache_budget_mb
            self.runner = BatchedRunner(lm.model, max_batch_size=self.config.max_batch_size,
                                        greedy=self.config.llm_greedy, observer=self.llm_observer,
                                        initial_hop=self._initial_hop, token2wav_workers=self._token2wav_workers(),
                                        flow_cache=cached,
                                        flow_cache_precision=self.config.flow_cache_precision,
                                        flow_cache_window_frames=self.config.flow_cache_window_frames,
                                        flow_prompt_cache_mb=self.config.flow_prompt_cache_mb,
                                        flow_cache_budget_mb=budget_mb(budget, str(lm.device)) if cached else budget,
                                        token2wav_batch=self._token2wav_batch(),
                                        token2wav_max_batch=self.config.token2wav_max_batch,
                                        prefill_batch=self._prefill_batch(),
                                        flow_observer=self.llm_observer if hasattr(self.llm_observer, "on_flow_round")
                                        else None)
            self.runner.set_bulk_room(self._bulk_room)
            if self.runner.flow_cache:
                self.runner.flow_runtime = stream_estimator(lm.model.flow, self.config.levers,
                                                            self.config.flow_cache_precision)
        elif self.config.flow_cache is True:
            log.warning("engine.flow_cache needs the batched CosyVoice2/3 path (engine.batching): not used")
        instrument(lm.model)  # flow / HiFT seconds per request (app/engines/timings.py), outermost
        self._speakers = tuple(sorted(
            k for k, v in lm.frontend.spk2info.items()
            if isinstance(v, dict) and "embedding" in v and "text" not in v and "prompt_speech_feat" not in v))
        self._info = EngineInfo(name=self.name, family=family, sample_rate=self.sample_rate, modes=self._modes(),
                                tiny=lm.tiny, voice_family=self.prompts.family,
                                first_chunk_tokens=self.runner.first_hop_bounds if self.runner is not None else None,
                                device=str(getattr(lm.model, "device", "cpu")),
                                fingerprint=files_fingerprint(lm.model_dir))
        log.info(
            "loaded CosyVoice%d model %s in %.1fs on %s (rate %d Hz, %s, %s, modes %s%s; CosyVoice code from %s; "
            "text normalization %s)",
            lm.version, lm.model_dir, time.perf_counter() - t0, device_text(lm.device_info), self.sample_rate,
            _precision_text(lm.precision), lm.levers.describe(),
            ",".join(self._info.modes), ", random-weight test model" if lm.tiny else "",
            lm.code_dir, "on (wetext)" if self.normalizer.enabled else "off",
        )
        if self.runner is not None:
            log.info("LLM batching on: up to %d requests per decode step; token2wav %s", self.config.max_batch_size,
                     "batched in one flow thread" if self.runner.flow_rounds is not None else "per request")

    @property
    def _on_cuda(self) -> bool:
        """The loaded model computes on a CUDA device (what the ``auto`` settings below follow)."""
        return str(getattr(self.loaded.model, "device", "cpu")).startswith("cuda")

    def _flow_cache(self) -> bool:
        """``engine.flow_cache``: auto is on where a cacheable flow computes on the CPU (docs/cpu.md), not on CUDA."""
        from app.engines.cosyvoice.flow.cache import supports_flow_cache

        if self.config.flow_cache == "auto":
            return (not self._on_cuda and self.config.token2wav_batch != "on"
                    and supports_flow_cache(self.loaded.model.flow))
        return bool(self.config.flow_cache)

    def _prefill_batch(self) -> bool:
        """``engine.prefill_batch``: on, off, or auto (on for CUDA, where one forward over all joiners replaces
        one per joiner; off on a CPU, where the packed forward measured 15-30 % slower than one by one,
        docs/batching.md)."""
        if self.config.prefill_batch != "auto":
            return self.config.prefill_batch == "on"
        return self._on_cuda

    def _token2wav_batch(self) -> bool:
        """``engine.token2wav_batch``: on, off, or auto (on for CUDA, where one batched flow pass per round
        replaces one pass per request; off on a CPU, where the flow is compute-bound and runs best one
        request per core, docs/batching.md)."""
        from app.engines.cosyvoice.flow.batch import unsupported_reason

        mode = self.config.token2wav_batch
        if mode == "off":
            return False
        reason = unsupported_reason(self.loaded.model.flow)
        if self._flow_cache():
            reason = "engine.flow_cache keeps per-stream estimator state, which a batched round does not"
        if mode == "on":
            if reason is not None:
                raise EngineFailure(f"engine.token2wav_batch is on, but {reason}")
            return True
        if self._on_cuda and reason is not None:
            log.info("token2wav batching (auto) stays off: %s", reason)
        return self._on_cuda and reason is None

    def _token2wav_workers(self) -> int | None:
        """On a CPU flow + HiFT are compute-bound: about one call per core; a GPU overlaps them."""
        if self.config.token2wav_workers:
            return self.config.token2wav_workers
        if self._on_cuda:
            return None
        return max(1, (os.cpu_count() or 1) // max(1, self.config.torch_threads))

    def _modes(self) -> tuple[str, ...]:
        modes = ["zero_shot", "cross_lingual", "vc"]
        if self._speakers:
            modes.insert(0, "sft")
        if self.loaded.version == 1 and self.loaded.instruct:
            modes.append("instruct")
        if self.loaded.version >= 2:
            modes.append("instruct2")
        return tuple(modes)

    def warmup(self) -> None:
        if self._speakers:
            req = SynthesisRequest(text="Hello, this is a warm-up.", mode="sft", speaker=self._speakers[0])
        else:
            t = np.arange(2 * PROMPT_RATE) / PROMPT_RATE
            tone = (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
            req = SynthesisRequest(text="Hello, this is a warm-up.", mode="zero_shot", prompt_text="hello there",
                                   prompt_audio=PromptAudio(tone, PROMPT_RATE))
        for _ in self.synthesize(req, threading.Event()):
            pass

    def health_check(self) -> None:
        if self.loaded is None:
            raise EngineFailure("engine is not loaded")
        if self.runner is not None and not self.runner.alive:
            raise EngineFailure("the LLM or flow scheduler thread has stopped")

    @property
    def batching(self) -> bool:
        return self.runner is not None

    def llm_stats(self) -> dict:
        """The LLM scheduler's state (running/pending sequences, steps, KV cache size); {} without batching."""
        return self.runner.scheduler.stats() if self.runner is not None else {}

    def flow_stats(self) -> dict:
        """The flow scheduler's rounds (jobs, largest round, cancelled, failed); {} without token2wav batching."""
        rounds = self.runner.flow_rounds if self.runner is not None else None
        return rounds.stats() if rounds is not None else {}

    def set_bulk_room(self, fn: Any) -> None:
        """``fn()``: how many bulk requests may compute now (the pool's room, ``app/engines/base.py``).

        The batched path steps bulk LLM rows only within it and runs interactive token2wav
        hops first; CosyVoice's own ``tts()`` path (v1, batching off) ignores classes."""
        self._bulk_room = fn
        if self.runner is not None:
            self.runner.set_bulk_room(fn)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None
        if self.prompts is not None:
            self.prompts.clear()
        self.loaded = None
        self.cancels = None

    # -- capabilities (read once at load) ------------------------------------------------------------
    def info(self) -> EngineInfo:
        if self._info is None:
            raise EngineFailure("engine is not loaded")
        return self._info

    def modes(self) -> tuple[str, ...]:
        return self.info().modes

    def voices(self) -> Sequence[str]:
        self.info()  # loaded, or a clear error
        return self._speakers

    # -- the voice library (VoiceCapable) ----------------------------------------------------------
    def compute_voice(self, prompt_text: str, audio: PromptAudio) -> VoiceFeatures:
        return self._prompt_frontend().compute(prompt_text, audio)

    def export_voice(self, voice: VoiceFeatures) -> bytes:
        return self._prompt_frontend().export(voice)

    def import_voice(self, data: bytes) -> VoiceFeatures:
        return self._prompt_frontend().load(data)

    def _prompt_frontend(self) -> PromptFrontend:
        if self.prompts is None:
            raise EngineFailure("engine is not loaded")
        return self.prompts

    # -- synthesis --------------------------------------------------------------------------------
    def synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        """Audio chunks for ``req``; its ``timings`` get the frontend/llm/flow/hift seconds."""
        return bound_iter(self._synthesize(req, cancel), req.timings)

    def _synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        info = self.info()  # loaded, or a clear error
        check_mode_inputs(req, info.modes, self._speakers)
        if req.first_chunk_tokens is not None:
            if self.runner is None:
                raise InvalidInput("first_chunk_tokens needs the batched CosyVoice2/3 path (engine.batching)")
            self.runner.check_first_hop(req.first_chunk_tokens)
        started = time.monotonic()  # the request's place in the token2wav gate, for all its segments
        # Upstream streams only at speed 1.0; at other speeds we stream sentence by sentence.
        stream = req.stream and abs(req.speed - 1.0) < 1e-6
        try:
            if req.text_stream is not None:
                yield from self._synthesize_text_stream(req, stream, cancel, started)
                return
            inputs = self.inputs.for_request(req, self.sample_rate)
            for index in itertools.count():
                with req.timings.measure("frontend"):
                    model_input = next(inputs, None)
                if model_input is None:
                    break
                if cancel.is_set():
                    return
                chunks = self._speak(model_input, stream, req, cancel, started, first_segment=index == 0)
                try:
                    for chunk in chunks:
                        yield dataclasses.replace(chunk, segment=index) if index else chunk
                finally:
                    chunks.close()  # a consumer that stops early aborts the segment's LLM work at once
        except (InvalidInput, EngineFailure):
            raise
        except Exception as exc:  # speakers, modes and inputs were validated above: this is our fault
            if cancel.is_set():
                return
            log.exception("CosyVoice synthesis failed (request %s)", req.request_id)
            raise EngineFailure(f"synthesis failed: {type(exc).__name__}") from exc

    def _speak(self, model_input: dict, stream: bool, req: SynthesisRequest,
               cancel: threading.Event, started: float, first_segment: bool = False) -> Iterator[AudioChunk]:
        """One segment's audio: through the batched LLM when it is on, else CosyVoice's own tts().

        A request's own first chunk size applies to its first segment (time to first audio).
        """
        if self.runner is not None:
            first_hop = req.first_chunk_tokens if stream and first_segment else None
            return self._run_batched(model_input, stream, req, cancel, started, first_hop)
        return self._run_tts(model_input, stream, req.speed, cancel)

    def _synthesize_text_stream(self, req: SynthesisRequest, stream: bool,
                                cancel: threading.Event, started: float) -> Iterator[AudioChunk]:
        """Text arriving over time (WebSocket sessions): v2/v3 batched at speed 1 speak it as bistream
        (audio starts mid-sentence); otherwise sentence by sentence."""
        if self.runner is not None and stream and req.mode in _BISTREAM_MODES:
            yield from self._run_bistream_segments(req, cancel, started)
            return
        spoken = False
        for sentence in segment_texts(req.text_stream, cancel, min_chars=0, max_chars=self.config.max_segment_chars):
            for model_input in self.inputs.for_request(replace(req, text=sentence, text_stream=None),
                                                       self.sample_rate):
                if cancel.is_set():
                    return
                spoken = True
                yield from self._speak(model_input, stream, req, cancel, started)
        if not spoken and not cancel.is_set():
            raise InvalidInput("the utterance has no text to speak")

    def _run_bistream_segments(self, req: SynthesisRequest, cancel: threading.Event,
                               started: float) -> Iterator[AudioChunk]:
        """One LLM sequence per segment (sentences within the LLM's budget, as HTTP cuts text): a long
        utterance costs what the same text costs over HTTP, not a context that grows with it. A segment
        whose text has all come when it starts is prefilled whole, as over HTTP; one still being written
        is spoken bistream (its audio starts before its sentence is complete)."""
        segments = StreamSegments(req.text_stream, max_chars=self.config.max_segment_chars,
                                  max_tokens=self.config.max_segment_tokens,
                                  count=lambda text: self.inputs.text_tokens(self.inputs.normalized(req, text)))
        prompt = None  # the voice's inputs, computed once for all segments (as HTTP's prompt_inputs)
        while (segment := segments.next(cancel)) is not None:
            index = segments.count - 1
            if prompt is None:
                prompt = self.inputs.bistream_prompt(req)
            whole = segment.ready_text()
            if whole is not None and speakable(whole):
                chunks = self._run_batched(self.inputs.with_text(req, prompt, whole), True, req, cancel, started)
            else:
                chunks = self._run_bistream(replace(req, text_stream=segment), prompt, cancel, started)
            try:
                for chunk in chunks:
                    yield dataclasses.replace(chunk, segment=index) if index else chunk
            finally:
                chunks.close()  # a consumer that stops early ends the segment's sequence at once
        if segments.count == 0 and not cancel.is_set():
            raise InvalidInput("the utterance has no text to speak")

    def _run_bistream(self, req: SynthesisRequest, prompt: dict, cancel: threading.Event,
                      started: float) -> Iterator[AudioChunk]:
        speech_out = self.runner.run_bistream(prompt, req.text_stream, self.inputs.tokenize,
                                              cancel=cancel, seed=req.seed, request_id=req.request_id,
                                              system_prompt=prompts.V3_SYSTEM_PROMPT,
                                              normalize=lambda text: self.inputs.normalized(req, text),
                                              cache_prompt=registered_voice(req), started=started, bulk=_bulk(req))
        for speech in speech_out:
            if cancel.is_set():
                return
            yield from self._chunk(speech)

    def _run_batched(self, model_input: dict, stream: bool, req: SynthesisRequest,
                     cancel: threading.Event, started: float, first_hop: int | None = None) -> Iterator[AudioChunk]:
        for speech in self.runner.run(model_input, stream=stream, speed=req.speed, cancel=cancel, seed=req.seed,
                                      request_id=req.request_id, cache_prompt=registered_voice(req),
                                      first_hop=first_hop, started=started, bulk=_bulk(req)):
            if cancel.is_set():
                return
            yield from self._chunk(speech)

    def _chunk(self, speech: Any) -> Iterator[AudioChunk]:
        """A CosyVoice speech tensor as one int16 chunk (none if it is empty)."""
        pcm = float_to_int16(speech.detach().cpu().float().numpy())
        if len(pcm):
            yield AudioChunk(pcm=pcm, sample_rate=self.sample_rate)

    def _run_tts(self, model_input: dict, stream: bool, speed: float, cancel: threading.Event) -> Iterator[AudioChunk]:
        model = self.loaded.model
        key = model_input.get("text") if model_input.get("source_speech_token") is None else model_input["source_speech_token"]
        if self._initial_hop is not None and self.cancels.active() == 0:
            # upstream CosyVoice2Model grows token_hop_len while streaming and never resets it
            model.token_hop_len = self._initial_hop
        ctx = self.cancels.begin(key, cancel)
        gen = model.tts(**model_input, stream=stream, speed=speed)
        finished = False
        try:
            for out in gen:
                if cancel.is_set():
                    return
                yield from self._chunk(out["tts_speech"])
                if cancel.is_set():
                    return
            finished = True
        finally:
            if not finished:
                ctx.aborted.set()
                gen.close()
            self.cancels.end(key, ctx, aborted=not finished)
            timings = current()
            if timings is not None and ctx.llm_s:
                timings.add("llm", ctx.llm_s)
