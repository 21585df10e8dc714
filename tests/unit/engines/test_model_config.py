"""Reading a model dir's config (app/engines/cosyvoice/model_config.py), on small hand-written configs (no torch)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from app.engines.base import EngineFailure
from app.engines.cosyvoice import layout
from app.engines.cosyvoice.model_config import config_overrides, read_model_config


def read(text: str, version: int = 2, model_dir: Path = Path("/models/m")) -> dict:
    return read_model_config(textwrap.dedent(text), model_dir=model_dir, version=version, name="m/cosyvoice2.yaml")


def test_training_only_entries_are_never_built():
    # a class that does not exist would fail the load if HyperPyYAML tried to build it
    configs = read("""\
        sample_rate: 24000
        hifigan: !new:cosyserve_no_such_module.HiFiGan
            discriminator: !new:cosyserve_no_such_module.Discriminator
        """)
    assert configs["sample_rate"] == 24000 and configs["hifigan"] is None
    assert layout.TRAINING_ONLY_ENTRIES == ("hifigan",)


def test_the_qwen_dir_is_the_model_dirs_own_for_v2_and_v3():
    text = "qwen_pretrain_path: ''\nllm_path: !ref <qwen_pretrain_path>\n"
    for version in (2, 3):
        assert read(text, version)["llm_path"] == str(Path("/models/m") / layout.QWEN_DIR)
    assert read(text, 1)["llm_path"] == ""  # v1 has no Qwen2
    assert config_overrides(Path("/x"), 1) == {"hifigan": None}
    assert config_overrides(Path("/x"), 3) == {"hifigan": None, layout.QWEN_PATH_ENTRY: str(Path("/x") / layout.QWEN_DIR)}


def test_a_config_without_those_entries_loads_too():
    assert read("sample_rate: 22050\n", 1)["sample_rate"] == 22050


@pytest.mark.parametrize("tag", ["!name:", "!new:"])
def test_a_name_that_does_not_exist_is_a_clear_engine_failure(tag):
    with pytest.raises(EngineFailure) as err:
        read(f"tokenize: {tag}cosyserve_no_such_module.tokenize\n")
    message = str(err.value)
    assert message.startswith("m/cosyvoice2.yaml names something the CosyVoice in use")
    assert "cosyserve_no_such_module.tokenize" in message and "engine.cosyvoice_path" in message


def test_a_module_that_fails_to_import_is_a_clear_engine_failure(tmp_path, monkeypatch):
    (tmp_path / "cosyserve_broken_mod.py").write_text("import cosyserve_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(EngineFailure) as err:
            read("f: !name:cosyserve_broken_mod.f\n")
    finally:
        sys.modules.pop("cosyserve_broken_mod", None)
    message = str(err.value)
    assert message.startswith("m/cosyvoice2.yaml: importing cosyserve_broken_mod failed")
    assert "ModuleNotFoundError" in message and "cosyserve_missing_dependency" in message
