"""Zero-shot prompt features: computed once per prompt, cached, and stored as library voices.

``PromptFrontend`` runs CosyVoice's zero-shot frontend (speech tokens, speaker
embedding, prompt mel) over a loaded model, keeps an LRU of the results keyed by
the prompt audio, and turns features into bytes and back for the voice library.
A voice's *family* says which engines can use its features: the model family plus a
fingerprint of the frontend models that computed them.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.engines.base import PROMPT_RATE, InvalidInput, PromptAudio, SynthesisRequest


@dataclass(frozen=True)
class VoiceFeatures:
    """Engine-ready zero-shot prompt features (tensors), computed once per prompt."""

    family: str
    features: dict
    prompt_text: str


def registered_voice(req: SynthesisRequest) -> bool:
    """The request speaks with a library voice (its prompt is reused: worth the flow's prompt cache)."""
    return req.prompt_audio is None and isinstance(req.voice, VoiceFeatures) and req.mode != "vc"


def voice_family(family: str, files: list[Path]) -> str:
    """``family`` + a fingerprint of the frontend model files (size and first MiB of each)."""
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.stat().st_size).encode())
        with open(path, "rb") as f:
            h.update(f.read(1 << 20))
    return f"{family}-{h.hexdigest()[:12]}"


class PromptFrontend:
    """The zero-shot frontend of one loaded model, with an LRU of prompt features. Thread-safe."""

    def __init__(self, frontend: Any, family: str, sample_rate: int, cache_size: int) -> None:
        self.frontend = frontend
        self.family = family
        self.sample_rate = sample_rate
        self.cache_size = cache_size
        self.hits = 0
        self._cache: OrderedDict[str, VoiceFeatures] = OrderedDict()
        self._lock = threading.Lock()
        params = list(inspect.signature(frontend._extract_speech_feat).parameters)
        self._takes_path = bool(params) and params[0] == "prompt_wav"

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

    @contextlib.contextmanager
    def audio(self, audio: PromptAudio) -> Iterator[Any]:
        """Prompt audio as this CosyVoice's frontend wants it.

        The PyPI copy takes a 16 kHz tensor; upstream HEAD takes a path (or file) and loads
        it with ``load_wav``. For the latter we hand over a temporary 16 kHz WAV.
        """
        wav = _at_prompt_rate(audio)
        if not self._takes_path:
            yield wav
            return
        import soundfile as sf

        with tempfile.NamedTemporaryFile(suffix=".wav") as f:
            sf.write(f.name, wav.squeeze(0).numpy(), PROMPT_RATE, subtype="FLOAT")
            yield f.name

    def compute(self, prompt_text: str, audio: PromptAudio) -> VoiceFeatures:
        """Run the zero-shot frontend once (speech tokens, speaker embedding, prompt mel)."""
        with self.audio(audio) as prompt:
            feats = self.frontend.frontend_zero_shot("", prompt_text, prompt, self.sample_rate, "")
        feats.pop("text", None)
        feats.pop("text_len", None)
        return VoiceFeatures(family=self.family, features=feats, prompt_text=prompt_text)

    def export(self, voice: VoiceFeatures) -> bytes:
        """Serialise features for the voice library (tensors only, loadable with weights_only)."""
        import torch

        buf = io.BytesIO()
        torch.save({"family": voice.family, "prompt_text": voice.prompt_text,
                    "features": {k: v.detach().cpu() for k, v in voice.features.items()}}, buf)
        return buf.getvalue()

    def load(self, data: bytes) -> VoiceFeatures:
        import torch

        blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        device = getattr(self.frontend, "device", "cpu")
        feats = {k: v.to(device) for k, v in blob["features"].items()}
        return VoiceFeatures(family=str(blob["family"]), features=feats, prompt_text=str(blob["prompt_text"]))

    def for_request(self, req: SynthesisRequest) -> VoiceFeatures:
        """The prompt's audio features: the request's voice, or computed from its prompt audio (LRU-cached)."""
        if req.prompt_audio is None:
            if not isinstance(req.voice, VoiceFeatures):
                raise InvalidInput(f"mode {req.mode!r} needs prompt audio or a registered voice")
            if req.voice.family != self.family:
                raise InvalidInput(f"voice was made for {req.voice.family}; the loaded model needs {self.family}")
            return req.voice
        audio = req.prompt_audio
        digest = hashlib.sha256(np.ascontiguousarray(audio.samples, dtype=np.float32).tobytes()).hexdigest()
        key = f"{digest}:{audio.sample_rate}"
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return hit
        voice = self.compute(req.prompt_text or "", audio)
        if self.cache_size > 0:
            with self._lock:
                self._cache[key] = voice
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return voice


def _at_prompt_rate(audio: PromptAudio) -> Any:
    """``audio`` as a ``[1, n]`` float tensor at the frontends' rate."""
    import torch
    import torchaudio.functional as AF

    wav = torch.from_numpy(np.ascontiguousarray(audio.samples, dtype=np.float32)).reshape(1, -1)
    if audio.sample_rate != PROMPT_RATE:
        wav = AF.resample(wav, audio.sample_rate, PROMPT_RATE)
    return wav
