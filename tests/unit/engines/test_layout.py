"""The model-dir contract (app/engines/cosyvoice/layout.py): names, version detection, the tiny marker (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.engines.base import EngineFailure
from app.engines.cosyvoice import layout

ROOT = Path(__file__).resolve().parents[3]

# The released dirs' file names, written out on purpose: layout.py must name exactly these.
PUBLISHED = {
    1: ("cosyvoice.yaml", "speech_tokenizer_v1.onnx"),  # CosyVoice-300M(-SFT, -Instruct)
    2: ("cosyvoice2.yaml", "speech_tokenizer_v2.onnx"),  # CosyVoice2-0.5B
    3: ("cosyvoice3.yaml", "speech_tokenizer_v3.onnx"),  # Fun-CosyVoice3-0.5B-2512
}
EVERY_RELEASE = ("llm.pt", "flow.pt", "hift.pt", "campplus.onnx", "spk2info.pt")


def _dir_with(root: Path, *names: str) -> Path:
    root.mkdir()
    for name in names:
        (root / name).write_text("")
    return root


def test_names_match_the_released_dirs():
    for version, (config, tokenizer) in PUBLISHED.items():
        assert layout.CONFIG_FILES[version] == config
        assert layout.SPEECH_TOKENIZER_FILES[version] == tokenizer
    assert set(layout.CONFIG_FILES) == set(layout.SPEECH_TOKENIZER_FILES) == set(layout.MODEL_CLASSES) == {1, 2, 3}
    assert (*layout.WEIGHT_FILES.values(), layout.CAMPPLUS, layout.SPK2INFO) == EVERY_RELEASE
    assert list(layout.WEIGHT_FILES) == ["llm", "flow", "hift"]  # the config's module keys
    assert layout.QWEN_DIR == "CosyVoice-BlankEN"
    # Qwen2's tokenizer files, as CosyVoice-BlankEN ships them (no tokenizer.json)
    assert layout.QWEN_TOKENIZER_FILES == ("vocab.json", "merges.txt", "tokenizer_config.json")
    # Fun-CosyVoice3-0.5B-2512's RL-tuned LLM next to llm.pt; llm.pt is the default, as upstream loads it
    assert layout.LLM_WEIGHTS == {"base": "llm.pt", "rl": "llm.rl.pt"}
    assert layout.FLOW_ESTIMATOR_ONNX == "flow.decoder.estimator.fp32.onnx"  # upstream's export for TensorRT
    assert layout.QWEN_PATH_ENTRY == "qwen_pretrain_path" and layout.TRAINING_ONLY_ENTRIES == ("hifigan",)


def test_endofprompt_follows_qwens_specials():
    assert layout.ENDOFPROMPT_ID == 151646
    assert layout.QWEN_SPECIALS_START == 151643
    assert layout.QWEN_SPECIALS[layout.ENDOFPROMPT_ID - layout.QWEN_SPECIALS_START] == layout.ENDOFPROMPT


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_dir_with_only_the_config_is_detected(tmp_path, version):
    model_dir = _dir_with(tmp_path / "m", layout.CONFIG_FILES[version])
    assert layout.detect_version(model_dir) == layout.find_version(model_dir) == version


def test_the_newest_config_wins(tmp_path):
    model_dir = _dir_with(tmp_path / "m", *layout.CONFIG_FILES.values())
    assert layout.detect_version(model_dir) == 3
    (model_dir / layout.CONFIG_FILES[3]).unlink()
    assert layout.detect_version(model_dir) == 2


def test_a_dir_without_a_config_is_not_a_model_dir(tmp_path):
    model_dir = _dir_with(tmp_path / "m", *EVERY_RELEASE, "config.yaml")
    (model_dir / layout.CONFIG_FILES[2]).mkdir()  # a directory of that name is no config
    assert layout.find_version(model_dir) is None
    assert layout.find_version(tmp_path / "missing") is None
    with pytest.raises(EngineFailure) as err:
        layout.detect_version(model_dir)
    assert "is not a CosyVoice model dir" in str(err.value)
    assert all(name in str(err.value) for name in layout.CONFIG_FILES.values())


def test_tiny_marker_round_trip(tmp_path):
    meta = {"version": 2, "seed": 0, "long": False, "instruct": False, "random_weights": True, "builder": 2}
    layout.write_tiny_marker(tmp_path, meta)
    assert layout.read_tiny_marker(tmp_path) == meta
    assert json.loads((tmp_path / layout.TINY_MARKER).read_text()) == meta
    assert (tmp_path / layout.TINY_MARKER).read_text().endswith("}\n")


@pytest.mark.parametrize("content", [None, "", "{not json", '["random_weights"]', "null", b"\xff\xfe{"],
                         ids=["missing", "empty", "broken", "a list", "null", "not utf-8"])
def test_a_missing_or_broken_marker_reads_as_empty(tmp_path, content):
    if isinstance(content, bytes):
        (tmp_path / layout.TINY_MARKER).write_bytes(content)
    elif content is not None:
        (tmp_path / layout.TINY_MARKER).write_text(content)
    assert layout.read_tiny_marker(tmp_path) == {}


def test_a_directory_in_the_markers_place_reads_as_empty(tmp_path):
    (tmp_path / layout.TINY_MARKER).mkdir()
    assert layout.read_tiny_marker(tmp_path) == {}


def test_layout_imports_neither_torch_nor_cosyvoice():
    code = "import sys, app.engines.cosyvoice.layout; print(sorted({'torch', 'cosyvoice'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stderr
