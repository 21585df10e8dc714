"""CosyVoiceEngine: the Engine contract over the real CosyVoice classes (v1, v2, v3).

This module and its helpers (``cosyvoice_load``, ``cosyvoice_cancel``,
``cosyvoice_compat``) are the only places that import torch or CosyVoice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import itertools
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.engines.base import (
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
from app.engines.timings import bound_iter, current, instrument
from app.text.normalize import TextNormalizer
from app.text.split import fit_token_budget, split_sentences
from app.text.stream import sentences

log = logging.getLogger("cosyserve.engine")

PROMPT_RATE = 16000
_LLM_PROMPT_KEYS = ("llm_prompt_speech_token", "llm_prompt_speech_token_len")
_TEXT_PROMPT_KEYS = ("prompt_text", "prompt_text_len")


@dataclass
class CosyVoiceConfig:
    model_dir: str
    cosyvoice_path: str | None = None
    dtype: str = "fp32"  # engine.dtype: auto | fp32 | bf16 | fp16 (app/engines/cosyvoice/precision.py)
    dtype_stages: tuple[str, ...] = ("llm", "flow")  # which stages run in a reduced dtype
    torch_threads: int = 1
    prompt_cache_size: int = 32
    max_segment_chars: int = 240
    max_segment_tokens: int = 80  # text tokens per LLM call, as upstream's frontend splits (token_max_n)
    text_normalization: str = "auto"  # auto: wetext for zh / en / ja, per sentence; off
    batching: bool = False  # v2/v3: the LLM runs in a shared continuous-batching scheduler
    max_batch_size: int = 16
    llm_greedy: bool = False  # testing only: argmax sampling
    token2wav_workers: int | None = None  # batched: token2wav calls at once; None: CPU cores (CPU), no limit (GPU)
    flow_cache: bool = False  # batched streaming: flow computes each hop's new frames only (flow_cache.py)
    flow_cache_window_frames: int | None = None  # keep at most this many cached frames per layer (inexact)
    flow_prompt_cache_mb: float = 0  # with flow_cache: registered voices' prompt flow state, LRU by bytes (0: off)


@dataclass(frozen=True)
class VoiceFeatures:
    """Engine-ready zero-shot prompt features (tensors), computed once per prompt."""

    family: str
    features: dict
    prompt_text: str


def _registered_voice(req: SynthesisRequest) -> bool:
    """The request speaks with a library voice (its prompt is reused: worth the flow's prompt cache)."""
    return req.prompt_audio is None and isinstance(req.voice, VoiceFeatures) and req.mode != "vc"


def _precision_text(precision: Any) -> str:
    return f"{precision.dtype} for {'+'.join(precision.stages)}" if precision.reduced else "fp32"


class CosyVoiceEngine:
    def __init__(self, config: CosyVoiceConfig, name: str | None = None, llm_observer: Any = None) -> None:
        self.config = config
        self.llm_observer = llm_observer  # LLMObserver: batch sizes, step times, tokens (metrics)
        self._batched: Any = None  # BatchedRunner when the LLM is batched across requests
        self.name = name or os.path.basename(os.path.normpath(config.model_dir))
        self.sample_rate = 0
        self._loaded: Any = None
        self._cancel: Any = None
        self._prompt_cache: OrderedDict[str, VoiceFeatures] = OrderedDict()
        self._prompt_lock = threading.Lock()
        self._initial_hop: int | None = None
        self.prompt_cache_hits = 0
        self._voice_family: str | None = None
        self._path_frontend = False
        self.normalizer = TextNormalizer(config.text_normalization)

    # -- lifecycle ------------------------------------------------------------------------------
    def load(self) -> None:
        import torch

        from app.engines.cosyvoice.cancel import CancelRegistry
        from app.engines.cosyvoice.load import load_model_dir

        torch.set_num_threads(max(1, int(self.config.torch_threads)))
        t0 = time.perf_counter()
        self.normalizer.load()
        self._loaded = load_model_dir(self.config.model_dir, dtype=self.config.dtype,
                                      dtype_stages=tuple(self.config.dtype_stages),
                                      cosyvoice_path=self.config.cosyvoice_path)
        self._cancel = CancelRegistry(self._loaded.model, observer=self.llm_observer)
        self.sample_rate = self._loaded.sample_rate
        self._initial_hop = getattr(self._loaded.model, "token_hop_len", None)
        if self.config.llm_greedy and self._loaded.version >= 2:
            from app.engines.cosyvoice.batching.sampling import ranked_greedy

            self._loaded.model.llm.sampling = ranked_greedy()  # testing: deterministic per-request decoding
        if self.config.batching and self._loaded.version >= 2:
            from app.engines.cosyvoice.batched import BatchedRunner

            self._batched = BatchedRunner(self._loaded.model, max_batch_size=self.config.max_batch_size,
                                          greedy=self.config.llm_greedy, observer=self.llm_observer,
                                          initial_hop=self._initial_hop,
                                          token2wav_workers=self._token2wav_workers(),
                                          flow_cache=self.config.flow_cache,
                                          flow_cache_window_frames=self.config.flow_cache_window_frames,
                                          flow_prompt_cache_mb=self.config.flow_prompt_cache_mb)
        elif self.config.flow_cache:
            log.warning("engine.flow_cache needs the batched CosyVoice2/3 path (engine.batching): not used")
        instrument(self._loaded.model)  # flow / HiFT seconds per request (app/engines/timings.py), outermost
        params = list(inspect.signature(self._loaded.frontend._extract_speech_feat).parameters)
        self._path_frontend = bool(params) and params[0] == "prompt_wav"
        log.info(
            "loaded CosyVoice%d model %s in %.1fs (rate %d Hz, %s, modes %s%s; CosyVoice code from %s; "
            "text normalization %s)",
            self._loaded.version, self._loaded.model_dir, time.perf_counter() - t0, self.sample_rate,
            _precision_text(self._loaded.precision),
            ",".join(self.modes()), ", random-weight test model" if self._loaded.tiny else "",
            self._loaded.code_dir, "on (wetext)" if self.normalizer.enabled else "off",
        )
        if self._batched is not None:
            log.info("LLM batching on: up to %d requests per decode step", self.config.max_batch_size)

    def _token2wav_workers(self) -> int | None:
        """On a CPU flow + HiFT are compute-bound: about one call per core; a GPU overlaps them."""
        if self.config.token2wav_workers:
            return self.config.token2wav_workers
        if str(getattr(self._loaded.model, "device", "cpu")).startswith("cuda"):
            return None
        return max(1, (os.cpu_count() or 1) // max(1, self.config.torch_threads))

    def warmup(self) -> None:
        speakers = self.voices()
        if speakers:
            req = SynthesisRequest(text="Hello, this is a warm-up.", mode="sft", speaker=speakers[0])
        else:
            t = np.arange(2 * PROMPT_RATE) / PROMPT_RATE
            tone = (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
            req = SynthesisRequest(text="Hello, this is a warm-up.", mode="zero_shot", prompt_text="hello there",
                                   prompt_audio=PromptAudio(tone, PROMPT_RATE))
        for _ in self.synthesize(req, threading.Event()):
            pass

    def health_check(self) -> None:
        if self._loaded is None:
            raise EngineFailure("engine is not loaded")
        if self._batched is not None and not self._batched.alive:
            raise EngineFailure("the LLM scheduler thread has stopped")

    @property
    def batching(self) -> bool:
        return self._batched is not None

    def llm_stats(self) -> dict:
        """The LLM scheduler's state (running/pending sequences, steps, KV cache size); {} without batching."""
        return self._batched.scheduler.stats() if self._batched is not None else {}

    def close(self) -> None:
        if self._batched is not None:
            self._batched.close()
            self._batched = None
        self._loaded = None
        self._cancel = None
        with self._prompt_lock:
            self._prompt_cache.clear()

    # -- capabilities ---------------------------------------------------------------------------
    @property
    def family(self) -> str:
        return f"cosyvoice{self._loaded.version}" if self._loaded else "cosyvoice"

    @property
    def voice_family(self) -> str:
        """Which stored voice features this engine can use: family + its frontend models' fingerprint."""
        lm = self._require()
        if self._voice_family is None:
            from app.engines.cosyvoice.load import TOKENIZER_FILES

            h = hashlib.sha256()
            for name in ("campplus.onnx", TOKENIZER_FILES[lm.version]):
                path = lm.model_dir / name
                h.update(str(path.stat().st_size).encode())
                with open(path, "rb") as f:
                    h.update(f.read(1 << 20))
            self._voice_family = f"{self.family}-{h.hexdigest()[:12]}"
        return self._voice_family

    def modes(self) -> tuple[str, ...]:
        lm = self._require()
        modes = ["zero_shot", "cross_lingual", "vc"]
        if self.voices():
            modes.insert(0, "sft")
        if lm.version == 1 and lm.instruct:
            modes.append("instruct")
        if lm.version >= 2:
            modes.append("instruct2")
        return tuple(modes)

    def info(self) -> EngineInfo:
        lm = self._require()
        return EngineInfo(name=self.name, family=self.family, sample_rate=self.sample_rate, modes=self.modes(),
                          tiny=lm.tiny, voice_family=self.voice_family)

    def voices(self) -> Sequence[str]:
        lm = self._require()
        return sorted(k for k, v in lm.frontend.spk2info.items() if isinstance(v, dict) and "embedding" in v and "text" not in v and "prompt_speech_feat" not in v)

    def _require(self) -> Any:
        if self._loaded is None:
            raise EngineFailure("engine is not loaded")
        return self._loaded

    # -- prompt features (zero-shot frontend work, cached) --------------------------------------
    def _prompt_16k(self, audio: PromptAudio) -> Any:
        import torch
        import torchaudio.functional as AF

        wav = torch.from_numpy(np.ascontiguousarray(audio.samples, dtype=np.float32)).reshape(1, -1)
        if audio.sample_rate != PROMPT_RATE:
            wav = AF.resample(wav, audio.sample_rate, PROMPT_RATE)
        return wav

    @contextlib.contextmanager
    def _frontend_audio(self, audio: PromptAudio) -> Iterator[Any]:
        """Prompt audio as this CosyVoice's frontend wants it.

        The PyPI copy takes a 16 kHz tensor; upstream HEAD takes a path (or file) and loads
        it with ``load_wav``. For the latter we hand over a temporary 16 kHz WAV.
        """
        wav = self._prompt_16k(audio)
        if not self._path_frontend:
            yield wav
            return
        import soundfile as sf

        with tempfile.NamedTemporaryFile(suffix=".wav") as f:
            sf.write(f.name, wav.squeeze(0).numpy(), PROMPT_RATE, subtype="FLOAT")
            yield f.name

    def compute_voice(self, prompt_text: str, audio: PromptAudio) -> VoiceFeatures:
        """Run the zero-shot frontend once (speech tokens, speaker embedding, prompt mel)."""
        lm = self._require()
        with self._frontend_audio(audio) as prompt:
            feats = lm.frontend.frontend_zero_shot("", prompt_text, prompt, self.sample_rate, "")
        feats.pop("text", None)
        feats.pop("text_len", None)
        return VoiceFeatures(family=self.voice_family, features=feats, prompt_text=prompt_text)

    def export_voice(self, voice: VoiceFeatures) -> bytes:
        """Serialise features for the voice library (tensors only, loadable with weights_only)."""
        import io

        import torch

        buf = io.BytesIO()
        torch.save({"family": voice.family, "prompt_text": voice.prompt_text,
                    "features": {k: v.detach().cpu() for k, v in voice.features.items()}}, buf)
        return buf.getvalue()

    def import_voice(self, data: bytes) -> VoiceFeatures:
        import io

        import torch

        blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        device = getattr(self._require().frontend, "device", "cpu")
        feats = {k: v.to(device) for k, v in blob["features"].items()}
        return VoiceFeatures(family=str(blob["family"]), features=feats, prompt_text=str(blob["prompt_text"]))

    def _audio_features(self, req: SynthesisRequest) -> VoiceFeatures:
        """The prompt's audio features: the request's voice, or computed from its prompt audio (LRU-cached)."""
        if req.prompt_audio is None:
            if not isinstance(req.voice, VoiceFeatures):
                raise InvalidInput(f"mode {req.mode!r} needs prompt audio or a registered voice")
            if req.voice.family != self.voice_family:
                raise InvalidInput(f"voice was made for {req.voice.family}; the loaded model needs {self.voice_family}")
            return req.voice
        audio = req.prompt_audio
        digest = hashlib.sha256(np.ascontiguousarray(audio.samples, dtype=np.float32).tobytes()).hexdigest()
        key = f"{digest}:{audio.sample_rate}"
        with self._prompt_lock:
            hit = self._prompt_cache.get(key)
            if hit is not None:
                self._prompt_cache.move_to_end(key)
                self.prompt_cache_hits += 1
                return hit
        voice = self.compute_voice(req.prompt_text or "", audio)
        if self.config.prompt_cache_size > 0:
            with self._prompt_lock:
                self._prompt_cache[key] = voice
                while len(self._prompt_cache) > self.config.prompt_cache_size:
                    self._prompt_cache.popitem(last=False)
        return voice

    def _prompt_inputs(self, req: SynthesisRequest) -> dict:
        """Model inputs shared by every segment of a prompt-based request (everything but the text)."""
        fe = self._require().frontend
        voice = self._audio_features(req)
        base = dict(voice.features)
        if req.mode == "cross_lingual":
            drop = _TEXT_PROMPT_KEYS + _LLM_PROMPT_KEYS
        else:
            version = self._loaded.version
            if req.mode == "instruct2":
                prompt_text = prompts.instruction(version, req.instruct_text or "")
                drop = _LLM_PROMPT_KEYS
            else:  # zero_shot: the request's transcript, else the registered voice's
                transcript = self._normalized(req, (req.prompt_text or "").strip() or voice.prompt_text)
                if not transcript.strip():
                    raise InvalidInput("mode 'zero_shot' needs 'prompt_text': the transcript of the prompt audio")
                prompt_text = prompts.zero_shot_prompt(version, transcript)
                drop = ()
            base["prompt_text"], base["prompt_text_len"] = fe._extract_text_token(prompt_text)
        for k in drop:
            base.pop(k, None)
        return base

    # -- text -------------------------------------------------------------------------------------
    def _normalized(self, req: SynthesisRequest, text: str) -> str:
        """``text`` normalized unless the request (``normalize: false``) or the config turned it off."""
        return text if req.normalize is False else self.normalizer.normalize(text)

    def text_tokens(self, text: str) -> int:
        return int(self._require().frontend._extract_text_token(text)[0].shape[1])

    def segments(self, req: SynthesisRequest) -> list[str]:
        """The text pieces one LLM call each speaks, in order: normalized, split into sentences within the
        character and text-token budgets (without the v3 system prompt the adapter adds to some modes)."""
        text = self._normalized(req, req.text)
        pieces = split_sentences(text, max_len=self.config.max_segment_chars)
        return fit_token_budget(pieces, self.text_tokens, self.config.max_segment_tokens)

    # -- synthesis --------------------------------------------------------------------------------
    def _model_inputs(self, req: SynthesisRequest) -> Iterator[dict]:
        lm = self._require()
        fe = lm.frontend
        if req.mode == "vc":
            with self._frontend_audio(req.source_audio) as src, self._frontend_audio(req.prompt_audio) as prompt:
                model_input = fe.frontend_vc(src, prompt, self.sample_rate)
            yield model_input
            return
        segments = self.segments(req)
        if not segments:
            raise InvalidInput("text has nothing to speak (only punctuation or whitespace)")
        base = self._prompt_inputs(req) if req.mode in ("zero_shot", "cross_lingual", "instruct2") else {}
        for seg in segments:
            seg = prompts.speech_text(lm.version, req.mode, seg)
            if req.mode == "sft":
                yield fe.frontend_sft(seg, req.speaker)
            elif req.mode == "instruct":
                # composed here: the PyPI copy appends <endofprompt> itself, upstream HEAD does not
                model_input = fe.frontend_sft(seg, req.speaker)
                model_input.pop("llm_embedding", None)  # instruct mode drops the speaker from the LLM
                instruct = prompts.instruction(1, req.instruct_text or "")
                model_input["prompt_text"], model_input["prompt_text_len"] = fe._extract_text_token(instruct)
                yield model_input
            else:
                text, text_len = fe._extract_text_token(seg)
                yield dict(base, text=text, text_len=text_len)

    def synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        """Audio chunks for ``req``; its ``timings`` get the frontend/llm/flow/hift seconds."""
        return bound_iter(self._synthesize(req, cancel), req.timings)

    def _synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        self._require()  # loaded, or a clear error
        check_mode_inputs(req, self.modes(), self.voices())
        # Upstream streams only at speed 1.0; at other speeds we stream sentence by sentence.
        stream = req.stream and abs(req.speed - 1.0) < 1e-6
        try:
            if req.text_stream is not None:
                yield from self._synthesize_text_stream(req, stream, cancel)
                return
            inputs = self._model_inputs(req)
            for index in itertools.count():
                with req.timings.measure("frontend"):
                    model_input = next(inputs, None)
                if model_input is None:
                    break
                if cancel.is_set():
                    return
                chunks = self._speak(model_input, stream, req, cancel)
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
               cancel: threading.Event) -> Iterator[AudioChunk]:
        """One segment's audio: through the batched LLM when it is on, else CosyVoice's own tts()."""
        if self._batched is not None:
            return self._run_batched(model_input, stream, req, cancel)
        return self._run_tts(self._require().model, model_input, stream, req.speed, cancel)

    # -- text that arrives over time (WebSocket sessions) --------------------------------------
    _BISTREAM_MODES = ("sft", "zero_shot", "cross_lingual", "instruct2")

    def _synthesize_text_stream(self, req: SynthesisRequest, stream: bool,
                                cancel: threading.Event) -> Iterator[AudioChunk]:
        """v2/v3 batched at speed 1: bistream (audio starts mid-sentence); otherwise sentence by sentence."""
        if self._batched is not None and stream and req.mode in self._BISTREAM_MODES:
            yield from self._run_bistream(req, cancel)
            return
        spoken = False
        for sentence in sentences(req.text_stream.pieces(cancel), max_len=self.config.max_segment_chars):
            for model_input in self._model_inputs(replace(req, text=sentence, text_stream=None)):
                if cancel.is_set():
                    return
                spoken = True
                yield from self._speak(model_input, stream, req, cancel)
        if not spoken and not cancel.is_set():
            raise InvalidInput("the utterance has no text to speak")

    def _run_bistream(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        fe = self._require().frontend
        if req.mode == "sft":
            model_input = fe.frontend_sft("", req.speaker)
        else:
            model_input = self._prompt_inputs(req)
        for key in ("text", "text_len"):
            model_input.pop(key, None)

        def tokenize(text: str) -> list[int]:
            return [int(t) for t in fe._extract_text_token(text)[0].flatten().tolist()]

        for speech in self._batched.run_bistream(model_input, req.text_stream, tokenize, cancel=cancel,
                                                 seed=req.seed, request_id=req.request_id,
                                                 system_prompt=prompts.V3_SYSTEM_PROMPT,
                                                 normalize=lambda text: self._normalized(req, text),
                                                 cache_prompt=_registered_voice(req)):
            if cancel.is_set():
                return
            yield from self._chunk(speech)

    def _run_batched(self, model_input: dict, stream: bool, req: SynthesisRequest,
                     cancel: threading.Event) -> Iterator[AudioChunk]:
        for speech in self._batched.run(model_input, stream=stream, speed=req.speed, cancel=cancel,
                                        seed=req.seed, request_id=req.request_id,
                                        cache_prompt=_registered_voice(req)):
            if cancel.is_set():
                return
            yield from self._chunk(speech)

    def _chunk(self, speech: Any) -> Iterator[AudioChunk]:
        """A CosyVoice speech tensor as one int16 chunk (none if it is empty)."""
        pcm = float_to_int16(speech.detach().cpu().float().numpy())
        if len(pcm):
            yield AudioChunk(pcm=pcm, sample_rate=self.sample_rate)

    def _run_tts(self, model: Any, model_input: dict, stream: bool, speed: float, cancel: threading.Event) -> Iterator[AudioChunk]:
        key = model_input.get("text") if model_input.get("source_speech_token") is None else model_input["source_speech_token"]
        if self._initial_hop is not None and self._cancel.active() == 0:
            # upstream CosyVoice2Model grows token_hop_len while streaming and never resets it
            model.token_hop_len = self._initial_hop
        ctx = self._cancel.begin(key, cancel)
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
            self._cancel.end(key, ctx, aborted=not finished)
            timings = current()
            if timings is not None and ctx.llm_s:
                timings.add("llm", ctx.llm_s)
