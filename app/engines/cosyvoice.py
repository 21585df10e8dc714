"""CosyVoiceEngine: the Engine contract over the real CosyVoice classes (v1, v2, v3).

This module and its helpers (``cosyvoice_load``, ``cosyvoice_cancel``,
``cosyvoice_compat``) are the only places that import torch or CosyVoice.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

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
from app.engines.text import split_sentences

log = logging.getLogger("cosyserve.engine")

PROMPT_RATE = 16000
_LLM_PROMPT_KEYS = ("llm_prompt_speech_token", "llm_prompt_speech_token_len")
_TEXT_PROMPT_KEYS = ("prompt_text", "prompt_text_len")


@dataclass
class CosyVoiceConfig:
    model_dir: str
    cosyvoice_path: str | None = None
    fp16: bool = False
    torch_threads: int = 1
    prompt_cache_size: int = 32
    max_segment_chars: int = 240


@dataclass(frozen=True)
class VoiceFeatures:
    """Engine-ready zero-shot prompt features (tensors), computed once per prompt."""

    family: str
    features: dict
    prompt_text: str


class CosyVoiceEngine:
    def __init__(self, config: CosyVoiceConfig, name: str | None = None) -> None:
        self.config = config
        self.name = name or os.path.basename(os.path.normpath(config.model_dir))
        self.sample_rate = 0
        self._loaded: Any = None
        self._cancel: Any = None
        self._prompt_cache: OrderedDict[str, VoiceFeatures] = OrderedDict()
        self._prompt_lock = threading.Lock()
        self._initial_hop: int | None = None
        self.prompt_cache_hits = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def load(self) -> None:
        from app.engines.cosyvoice_cancel import CancelRegistry
        from app.engines.cosyvoice_load import load_model_dir

        import torch

        torch.set_num_threads(max(1, int(self.config.torch_threads)))
        t0 = time.perf_counter()
        self._loaded = load_model_dir(self.config.model_dir, fp16=self.config.fp16, cosyvoice_path=self.config.cosyvoice_path)
        self._cancel = CancelRegistry(self._loaded.model)
        self.sample_rate = self._loaded.sample_rate
        self._initial_hop = getattr(self._loaded.model, "token_hop_len", None)
        log.info(
            "loaded CosyVoice%d model %s in %.1fs (rate %d Hz, modes %s%s)",
            self._loaded.version, self._loaded.model_dir, time.perf_counter() - t0, self.sample_rate,
            ",".join(self.modes()), ", random-weight test model" if self._loaded.tiny else "",
        )

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

    def close(self) -> None:
        self._loaded = None
        self._cancel = None
        with self._prompt_lock:
            self._prompt_cache.clear()

    # -- capabilities ---------------------------------------------------------------------------
    @property
    def family(self) -> str:
        return f"cosyvoice{self._loaded.version}" if self._loaded else "cosyvoice"

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
        return EngineInfo(name=self.name, family=self.family, sample_rate=self.sample_rate, modes=self.modes(), tiny=lm.tiny)

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

    def compute_voice(self, prompt_text: str, audio: PromptAudio) -> VoiceFeatures:
        """Run the zero-shot frontend once (speech tokens, speaker embedding, prompt mel)."""
        lm = self._require()
        wav = self._prompt_16k(audio)
        feats = lm.frontend.frontend_zero_shot("", prompt_text, wav, self.sample_rate, "")
        feats.pop("text", None)
        feats.pop("text_len", None)
        return VoiceFeatures(family=self.family, features=feats, prompt_text=prompt_text)

    def _voice_for(self, req: SynthesisRequest, prompt_text: str) -> VoiceFeatures:
        if isinstance(req.voice, VoiceFeatures) and req.mode in ("zero_shot", "cross_lingual") and req.voice.prompt_text == prompt_text:
            if req.voice.family != self.family:
                raise InvalidInput(f"voice was made for {req.voice.family}, the loaded model is {self.family}")
            return req.voice
        audio = req.prompt_audio
        if audio is None and isinstance(req.voice, VoiceFeatures):
            raise InvalidInput(f"mode {req.mode!r} needs prompt audio")
        key = hashlib.sha256(np.ascontiguousarray(audio.samples, dtype=np.float32).tobytes()).hexdigest()
        key = f"{key}:{audio.sample_rate}:{prompt_text}"
        with self._prompt_lock:
            hit = self._prompt_cache.get(key)
            if hit is not None:
                self._prompt_cache.move_to_end(key)
                self.prompt_cache_hits += 1
                return hit
        voice = self.compute_voice(prompt_text, audio)
        if self.config.prompt_cache_size > 0:
            with self._prompt_lock:
                self._prompt_cache[key] = voice
                while len(self._prompt_cache) > self.config.prompt_cache_size:
                    self._prompt_cache.popitem(last=False)
        return voice

    # -- synthesis --------------------------------------------------------------------------------
    def _model_inputs(self, req: SynthesisRequest) -> Iterator[dict]:
        lm = self._require()
        fe = lm.frontend
        if req.mode == "vc":
            src = self._prompt_16k(req.source_audio)
            prompt = self._prompt_16k(req.prompt_audio)
            yield fe.frontend_vc(src, prompt, self.sample_rate)
            return
        segments = split_sentences(req.text, max_len=self.config.max_segment_chars)
        if not segments:
            raise InvalidInput("text has nothing to speak (only punctuation or whitespace)")
        base: dict | None = None
        if req.mode == "zero_shot":
            prompt_text = (req.voice.prompt_text if isinstance(req.voice, VoiceFeatures) and req.prompt_audio is None
                           else (req.prompt_text or "").strip())
            base = dict(self._voice_for(req, prompt_text).features)
        elif req.mode == "cross_lingual":
            base = dict(self._voice_for(req, "").features)
            for k in _TEXT_PROMPT_KEYS + _LLM_PROMPT_KEYS:
                base.pop(k, None)
        elif req.mode == "instruct2":
            suffix = "<|endofprompt|>"
            base = dict(self._voice_for(req, (req.instruct_text or "").strip() + suffix).features)
            for k in _LLM_PROMPT_KEYS:
                base.pop(k, None)
        for seg in segments:
            if req.mode == "sft":
                yield fe.frontend_sft(seg, req.speaker)
            elif req.mode == "instruct":
                yield fe.frontend_instruct(seg, req.speaker, (req.instruct_text or "").strip())
            else:
                text, text_len = fe._extract_text_token(seg)
                yield dict(base, text=text, text_len=text_len)

    def synthesize(self, req: SynthesisRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        lm = self._require()
        check_mode_inputs(req, self.modes(), self.voices())
        if isinstance(req.voice, VoiceFeatures) and req.voice.family != self.family:
            raise InvalidInput(f"voice was made for {req.voice.family}; the loaded model is {self.family}")
        # Upstream streams only at speed 1.0; at other speeds we stream sentence by sentence.
        stream = req.stream and abs(req.speed - 1.0) < 1e-6
        try:
            for model_input in self._model_inputs(req):
                if cancel.is_set():
                    return
                yield from self._run_tts(lm.model, model_input, stream, req.speed, cancel)
        except (InvalidInput, EngineFailure):
            raise
        except KeyError as exc:
            raise InvalidInput(f"unknown speaker {exc.args[0]!r}") from exc
        except Exception as exc:  # noqa: BLE001 - a model fault becomes a domain error, details logged
            if cancel.is_set():
                return
            log.exception("CosyVoice synthesis failed (request %s)", req.request_id)
            raise EngineFailure(f"synthesis failed: {type(exc).__name__}") from exc

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
                pcm = float_to_int16(out["tts_speech"].detach().cpu().float().numpy())
                if len(pcm):
                    yield AudioChunk(pcm=pcm, sample_rate=self.sample_rate)
                if cancel.is_set():
                    return
            finished = True
        finally:
            if not finished:
                ctx.aborted.set()
                gen.close()
            self._cancel.end(key, ctx, aborted=not finished)
