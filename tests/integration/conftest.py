"""Integration fixtures: tiny random-weight CosyVoice model dirs built once per cache, loaded engines."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from app.engines.base import PromptAudio

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("COSYSERVE_TEST_MODELS", ROOT / ".cache" / "models"))


@pytest.fixture(scope="session", autouse=True)
def onnx_cache():
    """Exported ONNX graphs (engine.flow_runtime auto/onnxruntime) go beside the test models, not the home cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COSYSERVE_ENGINE__ONNX_CACHE_DIR", str(CACHE.parent / "onnx"))
        yield CACHE.parent / "onnx"


@pytest.fixture(scope="session")
def tiny_models():
    """``get(version, long=False, instruct=False) -> Path`` building each tiny model dir once."""
    from app.devmodels.tiny import ensure_tiny_model

    lock = threading.Lock()

    def get(version: int, long: bool = False, instruct: bool = False) -> Path:
        with lock:
            return Path(ensure_tiny_model(CACHE, version, long=long, instruct=instruct))

    return get


@pytest.fixture(scope="session")
def engines(tiny_models):
    """``get(version, long=False, instruct=False)``: a loaded CosyVoiceEngine, one per kind per session."""
    from app.engines.cosyvoice.engine import CosyVoiceConfig, CosyVoiceEngine

    loaded: dict = {}

    def get(version: int, long: bool = False, instruct: bool = False):
        key = (version, long, instruct)
        if key not in loaded:
            eng = CosyVoiceEngine(CosyVoiceConfig(model_dir=str(tiny_models(version, long, instruct)), torch_threads=1))
            eng.load()
            loaded[key] = eng
        return loaded[key]

    yield get
    for eng in loaded.values():
        eng.close()


def speechlike(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """A voiced-sounding test signal: harmonics with a wobbling pitch plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2)
    return (0.25 * x / np.max(np.abs(x)) + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


@pytest.fixture
def prompt_audio() -> PromptAudio:
    return PromptAudio(speechlike(3.0), 16000)
