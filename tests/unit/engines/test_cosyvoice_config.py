"""app/settings/runtime.py: every engine setting reaches the engine's config once, by name."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest
from pydantic import ValidationError

from app.engines.cosyvoice.config import (
    MAX_SEGMENT_CHARS,
    MAX_SEGMENT_TOKENS,
    CosyVoiceConfig,
)
from app.engines.cosyvoice.layout import CONFIG_FILES
from app.engines.cosyvoice.levers import Levers
from app.settings import EngineSettings, Settings
from app.settings.runtime import engine_config

# Engine settings the config does not take: the composition root uses them (the model's display name);
# model_dir is passed resolved. The levers' settings go into its Levers.
NOT_FOR_THE_ENGINE = {"name"}
LEVERS = {"llm_quantization", "flow_runtime", "flow_steps", "flow_cfg", "onnx_cache_dir"}


def test_every_engine_setting_is_mapped_by_name_or_into_the_levers():
    config_fields = {f.name for f in fields(CosyVoiceConfig)}
    unmapped = set(EngineSettings.model_fields) - config_fields
    assert unmapped == NOT_FOR_THE_ENGINE | LEVERS
    assert LEVERS <= {f.name for f in fields(Levers)}


def test_the_conversion_carries_each_value(tmp_path):
    eng = dict(dtype="bf16", dtype_stages=["llm"], torch_threads=3, prompt_cache_size=7, max_batch_size=5,
               token2wav_workers=2, flow_cache=True, flow_cache_window_frames=99, flow_prompt_cache_mb=12.5,
               text_normalization="off", cosyvoice_path=str(tmp_path), token2wav_batch="off",
               token2wav_max_batch=6, llm_quantization="int8", flow_runtime="onnxruntime", flow_steps=4,
               flow_cfg=False, onnx_cache_dir=None)
    settings = Settings(engine=eng, dev={"llm_greedy": True})
    cfg = engine_config(settings, "the-dir")
    assert cfg.model_dir == "the-dir" and cfg.llm_greedy is True
    for name in set(EngineSettings.model_fields) - NOT_FOR_THE_ENGINE - LEVERS - {"model_dir"}:
        expected = getattr(settings.engine, name)
        assert getattr(cfg, name) == (tuple(expected) if isinstance(expected, list) else expected), name
    for name in LEVERS:
        assert getattr(cfg.levers, name) == getattr(settings.engine, name), name
    assert cfg.levers.threads == 3 and cfg.dtype_stages == ("llm",)
    assert (cfg.max_segment_chars, cfg.max_segment_tokens) == (MAX_SEGMENT_CHARS, MAX_SEGMENT_TOKENS)


def test_runtime_configs_have_no_defaults_of_their_own():
    from app.serving.admission.limit.adaptive import AdaptiveConfig
    from app.serving.bounds import SpeechLimits
    from app.serving.config import PoolConfig
    from app.serving.session import SessionLimits

    for cls in (CosyVoiceConfig, Levers, PoolConfig, AdaptiveConfig, SessionLimits, SpeechLimits):
        defaulted = [f.name for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING]
        assert defaulted == [], cls
        assert "__post_init__" not in vars(cls), cls  # the settings check; the runtime config does not


def test_batching_is_decided_once_by_the_settings(tmp_path):
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / CONFIG_FILES[1]).write_text("")
    assert Settings(engine={"model_dir": str(v1)}).engine.batching is False  # CosyVoice1 has no batched LLM
    assert engine_config(Settings(engine={"model_dir": str(v1)}), str(v1)).batching is False
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / CONFIG_FILES[2]).write_text("")
    assert Settings(engine={"model_dir": str(v2)}).engine.batching is True
    assert Settings(engine={"model_dir": str(v2), "batching": False}).engine.batching is False
    assert Settings(dev={"tiny_version": 1}).engine.batching is False
    assert Settings(dev={"fake_engine": True}).engine.batching is False


def test_token2wav_batch_is_validated(tmp_path):
    assert EngineSettings().token2wav_batch == "auto"
    assert EngineSettings(token2wav_batch="auto", flow_cache=True).flow_cache  # auto: the flow cache wins at load
    for bad in ({"token2wav_batch": "yes"}, {"token2wav_max_batch": 0},
                {"token2wav_batch": "on", "flow_cache": True}):  # per-stream flow state cannot share a round
        with pytest.raises(ValidationError):
            EngineSettings(**bad)
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / CONFIG_FILES[1]).write_text("")
    with pytest.raises(ValidationError, match="needs the batched CosyVoice2/3 path"):
        Settings(engine={"model_dir": str(v1), "token2wav_batch": "on"})
    with pytest.raises(ValidationError, match="needs the batched CosyVoice2/3 path"):
        Settings(engine={"batching": False, "token2wav_batch": "on"})
    assert Settings(engine={"token2wav_batch": "on"}).engine.token2wav_batch == "on"
    assert Settings(engine={"token2wav_batch": "on"}, dev={"fake_engine": True}).dev.fake_engine
