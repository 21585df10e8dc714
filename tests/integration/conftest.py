"""Integration fixtures: tiny random-weight CosyVoice model dirs built once per cache, loaded engines."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.engines.base import PromptAudio
from tests.support import configs
from tests.support.paths import CACHE
from tests.support.sounds import speechlike


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
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    loaded: dict = {}

    def get(version: int, long: bool = False, instruct: bool = False):
        key = (version, long, instruct)
        if key not in loaded:
            eng = CosyVoiceEngine(configs.engine(model_dir=str(tiny_models(version, long, instruct)), torch_threads=1))
            eng.load()
            loaded[key] = eng
        return loaded[key]

    yield get
    for eng in loaded.values():
        eng.close()


@pytest.fixture
def prompt_audio() -> PromptAudio:
    return PromptAudio(speechlike(3.0), 16000)
