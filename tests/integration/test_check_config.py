"""``cosyserve check-config``: import every name a model config refers to (the images run it at build)."""

from __future__ import annotations

import importlib.util
import shlex
import shutil

import pytest

from app.cli import main
from app.engines.cosyvoice import layout

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _installed_cosyvoice(monkeypatch):
    monkeypatch.delenv("COSYSERVE_ENGINE__COSYVOICE_PATH", raising=False)
    monkeypatch.delenv("COSYSERVE_CONFIG", raising=False)


def test_our_v1_and_v2_configs_import_with_the_default_install(capsys):
    assert main(["check-config", "--version", "1", "--version", "2"]) == 0
    out = capsys.readouterr().out
    assert "ok: cosyserve's CosyVoice1 config: 33 of 33 names import" in out
    assert "ok: cosyserve's CosyVoice2 config:" in out
    if importlib.util.find_spec("pyarrow") is None:
        assert "cosyvoice.dataset.processor: training-only stand-in" in out


def test_v3_needs_the_v3_classes_and_says_which_are_missing(capsys):
    assert main(["check-config", "--version", "3"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: cosyserve's CosyVoice3 config" in out and "cosyvoice.llm.llm.CosyVoice3LM: no such name" in out


def test_a_model_dir_and_a_config_naming_a_missing_module(tiny_models, tmp_path, capsys):
    bad = tmp_path / "m"
    shutil.copytree(tiny_models(2), bad)
    config = bad / layout.CONFIG_FILES[2]
    config.write_text(config.read_text() + "extra: !name:cosyvoice.dataset.no_such_module.step\n")
    assert main(["check-config", str(tiny_models(2))]) == 0
    assert main(["check-config", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"ok: {tiny_models(2) / layout.CONFIG_FILES[2]}" in out
    assert f"FAILED: {config}" in out and "cosyvoice.dataset.no_such_module.step: no such name" in out


def test_nothing_to_check_is_a_usage_error(tmp_path, capsys):
    assert main(["check-config"]) == 2
    assert main(["check-config", str(tmp_path)]) == 2  # no config in it
    err = capsys.readouterr().err
    assert "nothing to check" in err and "is not a CosyVoice model dir" in err


def test_the_cpu_images_build_step_passes_here(capsys):
    """The very command the CPU Dockerfile runs at build (tests/unit/test_images.py checks it is there)."""
    from tests.unit.test_images import CHECK_CONFIG, runs

    command = CHECK_CONFIG["Dockerfile"]
    assert command in runs("Dockerfile")
    assert main(shlex.split(command)[1:]) == 0
    assert "FAILED" not in capsys.readouterr().out
