"""The random-weight model dirs' configs (app/devmodels/configs.py): templates as package data, the renderer (no torch)."""

from __future__ import annotations

import fnmatch
import importlib.resources
import tomllib
from pathlib import Path

import pytest
import yaml

from app.devmodels import configs
from app.engines.cosyvoice.layout import CONFIG_FILES

ROOT = Path(__file__).resolve().parents[3]
PARTIALS = {"_sampling.yaml", "_cfm.yaml", "_hift.yaml", "_seeds.yaml", "_gan.yaml", "_data_pipeline.yaml",
            "_whisper_fbank.yaml", "_whisper_fbank_step.yaml", "_training.yaml"}
# What a released config carries for training only (upstream's configs are its training configs).
PROCESSOR_STEPS = ("parquet_opener", "tokenize", "filter", "resample", "truncate", "compute_fbank", "compute_f0",
                   "parse_embedding", "shuffle", "sort", "batch", "padding")


def _template_names() -> set[str]:
    return {p.name for p in (importlib.resources.files("app.devmodels") / "templates").iterdir() if p.is_file()}


def _hyperpyyaml(text: str) -> dict:
    """Parse a config as YAML, HyperPyYAML's tags (!new:, !name:, !ref) read as plain values."""

    class Loader(yaml.SafeLoader):
        pass

    def tagged(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node)
        return loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else loader.construct_sequence(node)

    Loader.add_multi_constructor("!", tagged)
    return yaml.load(text, Loader=Loader)


def test_the_package_holds_one_template_per_version_and_the_partials():
    assert _template_names() == set(CONFIG_FILES.values()) | PARTIALS


def test_the_wheel_carries_every_template():
    """pyproject's package-data globs (relative to the ``app`` package) match every template file."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["app"]
    for name in _template_names():
        assert any(fnmatch.fnmatch(f"devmodels/templates/{name}", g) for g in globs), (name, globs)


@pytest.mark.parametrize("version, full_size", [(1, False), (2, False), (2, True), (3, False)],
                         ids=["v1", "v2", "v2-full", "v3"])
def test_every_config_renders_to_yaml_with_the_keys_cosyvoice_reads(version, full_size):
    text = configs.render_yaml(version, full_size=full_size)
    assert "$" not in text and "##" not in text
    assert text.startswith("# cosyserve ") and "RANDOM WEIGHTS" in text.splitlines()[0]
    parsed = _hyperpyyaml(text)
    assert {"sample_rate", "llm", "flow", "hift", "get_tokenizer", "allowed_special", "feat_extractor"} <= set(parsed)
    assert parsed["sample_rate"] == (22050 if version == 1 else 24000)
    assert parsed["llm"]["speech_token_size"] == configs.SPEECH_VOCAB[version]
    assert parsed["llm"]["sampling"]["top_k"] == 25  # the included partial, at the LLM's indentation
    assert parsed["flow"]["decoder"]["cfm_params"]["content"]["inference_cfg_rate"] == 0.7
    hift = parsed["hift"]
    assert hift["base_channels"] == (512 if full_size else configs.HIFT_BASE)
    assert ("conv_pre_look_right" in hift) == (version == 3)  # only v3's CausalHiFTGenerator takes it
    assert hift["f0_predictor"]["cond_channels"] == hift["base_channels"]


@pytest.mark.parametrize("version, full_size", [(1, False), (2, False), (2, True), (3, False)],
                         ids=["v1", "v2", "v2-full", "v3"])
def test_every_config_carries_the_training_part_of_a_released_one(version, full_size):
    text = configs.render_yaml(version, full_size=full_size)
    parsed = _hyperpyyaml(text)
    assert [k for k in parsed if k.startswith("__set_seed")] == [f"__set_seed{i}" for i in range(1, 5)]
    assert "__set_seed4: !apply:torch.cuda.manual_seed_all [1986]" in text
    for step in PROCESSOR_STEPS:
        assert f"{step}: !name:cosyvoice.dataset.processor.{step}\n" in text, step
    whisper = version == 3  # upstream's CosyVoice3 pipeline has the whisper log-mel step
    assert ("compute_whisper_fbank: !name:cosyvoice.dataset.processor.compute_whisper_fbank" in text) == whisper
    pipeline = [ref.strip("<>") for ref in parsed["data_pipeline"]]
    expected = ["parquet_opener", "tokenize", "filter", "resample", "compute_fbank", "parse_embedding",
                *(["compute_whisper_fbank"] if whisper else []), "shuffle", "sort", "batch", "padding"]
    assert pipeline == expected
    gan = [ref.strip("<>") for ref in parsed["data_pipeline_gan"]]
    assert gan[:4] == expected[:4] and "truncate" in gan and "compute_f0" in gan
    assert parsed["tokenize"] == {"get_tokenizer": "<get_tokenizer>", "allowed_special": "<allowed_special>"}
    hop = parsed["feat_extractor"]["hop_size"]
    assert parsed["compute_f0"]["hop_size"] == hop and parsed["truncate"]["truncate_length"] % hop == 0
    assert "hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan" in text
    assert parsed["hifigan"]["generator"] == "<hift>"
    assert parsed["mel_spec_transform1"]["hop_size"] == hop
    assert parsed["train_conf"]["optim"] == "adam" and parsed["train_conf_gan"]["accum_grad"] == 1


def test_v2_and_v3_share_one_hift_block():
    v2 = _hyperpyyaml(configs.render_yaml(2))["hift"]
    v3 = _hyperpyyaml(configs.render_yaml(3))["hift"]
    assert {k: v for k, v in v3.items() if k != "conv_pre_look_right"} == v2
    assert "HiFTGenerator" in configs.render_yaml(2) and "CausalHiFTGenerator" in configs.render_yaml(3)


def test_unknown_versions_and_full_size_v1_v3_are_refused():
    for version in (0, 4):
        with pytest.raises(ValueError):
            configs.render_yaml(version)
    for version in (1, 3):
        with pytest.raises(ValueError):
            configs.render_yaml(version, full_size=True)


def test_render_template_rules(tmp_path):
    (tmp_path / "main.yaml").write_text(
        "## a template comment\n"
        "top: $a\n"
        "outer:\n"
        "    $inner\n"
        "    $gone\n"
        "    b: ${b}x\n"
        "$block\n"
    )
    (tmp_path / "_inner.yaml").write_text("## partial\ninner: $a\n    deeper: 1\n\n    after_blank: 2\n")
    out = configs.render_template("main.yaml", {"a": 1, "b": 2, "gone": "", "block": "k: v\nl: w"}, tmp_path)
    assert out == (
        "top: 1\n"
        "outer:\n"
        "    inner: 1\n"
        "        deeper: 1\n"
        "\n"
        "        after_blank: 2\n"
        "    b: 2x\n"
        "k: v\n"
        "l: w\n"
    )
    with pytest.raises(KeyError):
        configs.render_template("main.yaml", {"b": 2, "gone": "", "block": ""}, tmp_path)
    with pytest.raises(FileNotFoundError):  # a block with neither a value nor a partial
        configs.render_template("main.yaml", {"a": 1, "b": 2, "inner": "", "block": ""}, tmp_path)
