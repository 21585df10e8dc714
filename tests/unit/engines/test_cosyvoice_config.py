"""CosyVoiceConfig.from_settings: every engine setting is mapped once, by name."""

from __future__ import annotations

from dataclasses import fields

from app.config import EngineSettings, Settings
from app.engines.cosyvoice.config import CosyVoiceConfig
from app.engines.cosyvoice.layout import CONFIG_FILES

# Settings the adapter does not take: the composition root uses them (which engine, the tiny default,
# the model's display name) or they are aliases resolved by the settings. model_dir is passed resolved.
NOT_FOR_THE_ADAPTER = {"kind", "fp16", "tiny_version", "tiny_cache_dir", "name", "fake_chunk_delay_s"}


def test_every_engine_setting_is_either_mapped_or_named_as_not_for_the_adapter():
    config_fields = {f.name for f in fields(CosyVoiceConfig)}
    unmapped = set(EngineSettings.model_fields) - config_fields
    assert unmapped == NOT_FOR_THE_ADAPTER


def test_from_settings_carries_each_value():
    eng = EngineSettings(dtype="bf16", dtype_stages=["llm"], torch_threads=3, prompt_cache_size=7, max_batch_size=5,
                         llm_greedy=True, token2wav_workers=2, flow_cache=True, flow_cache_window_frames=99,
                         flow_prompt_cache_mb=12.5, text_normalization="off", cosyvoice_path="somewhere",
                         token2wav_batch="off", token2wav_max_batch=6)
    cfg = CosyVoiceConfig.from_settings(eng, "the-dir")
    assert cfg.model_dir == "the-dir"
    for name in set(EngineSettings.model_fields) - NOT_FOR_THE_ADAPTER - {"model_dir"}:
        expected = getattr(eng, name)
        assert getattr(cfg, name) == (tuple(expected) if isinstance(expected, list) else expected), name
    assert cfg.dtype_stages == ("llm",)


def test_batching_is_decided_once_by_the_settings(tmp_path):
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / CONFIG_FILES[1]).write_text("")
    assert Settings(engine={"model_dir": str(v1)}).engine.batching is False  # CosyVoice1 has no batched LLM
    assert CosyVoiceConfig.from_settings(Settings(engine={"model_dir": str(v1)}).engine, str(v1)).batching is False
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / CONFIG_FILES[2]).write_text("")
    assert Settings(engine={"model_dir": str(v2)}).engine.batching is True
    assert Settings(engine={"model_dir": str(v2), "batching": False}).engine.batching is False
    assert Settings(engine={"tiny_version": 1}).engine.batching is False
    assert Settings(engine={"kind": "fake"}).engine.batching is False


def test_token2wav_batch_is_validated(tmp_path):
    import pytest
    from pydantic import ValidationError

    assert EngineSettings().token2wav_batch == "auto" and CosyVoiceConfig(model_dir="d").token2wav_batch == "auto"
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
        Settings(engine={"tiny_version": 2, "batching": False, "token2wav_batch": "on"})
    assert Settings(engine={"tiny_version": 2, "token2wav_batch": "on"}).engine.token2wav_batch == "on"
    assert Settings(engine={"kind": "fake", "token2wav_batch": "on"}).engine.kind == "fake"
