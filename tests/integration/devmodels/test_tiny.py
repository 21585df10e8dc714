"""The tiny random-weight CosyVoice model builder (app/devmodels/tiny.py) against the real CosyVoice code.

Every dir is built fresh into pytest's tmp dirs (never the shared model cache), once per
session, so these tests always exercise the current builder.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

import torch

from app.devmodels import tiny
from app.engines.cosyvoice import layout
from app.engines.cosyvoice.model_config import read_model_config
from app.engines.cosyvoice.shims import (
    TrainingOnlyError,
    TrainingOnlyModule,
    prepare_imports,
)

ROOT = Path(__file__).resolve().parents[3]  # the repo root: the subprocesses run this checkout's app, not the installed one

SENTENCE = (  # 20 words
    "The quick brown fox jumps over the lazy dog while seven happy children sing loudly near the old wooden bridge."
)
SHORT_SENTENCE = "Hello there, how are you today?"
TOKEN_RATE = {1: 50, 2: 25}  # speech tokens per second of audio
QWEN_MASK_BUG = (
    "CosyVoice's Qwen2Encoder.forward_one_step passes a 1-column attention mask while decoding with a "
    "KV cache; transformers>=5 pads it with False, so every decoding step attends only to the first "
    "(sos) position and the LLM never sees its context (see test_v2_incremental_decoding_sees_context)"
)


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-cache")


class Loaded:
    """One tiny model dir loaded the way the real CosyVoice front end and model classes load it."""

    def __init__(self, model_dir: Path, version: int) -> None:
        prepare_imports()
        from cosyvoice.cli.frontend import CosyVoiceFrontEnd

        self.dir, self.version = model_dir, version
        path = model_dir / layout.CONFIG_FILES[version]
        self.configs = read_model_config(path.read_text(encoding="utf-8"), model_dir=model_dir, version=version,
                                         name=str(path))
        self.frontend = CosyVoiceFrontEnd(
            self.configs["get_tokenizer"],
            self.configs["feat_extractor"],
            str(model_dir / layout.CAMPPLUS),
            str(model_dir / layout.SPEECH_TOKENIZER_FILES[version]),
            str(model_dir / layout.SPK2INFO),
            self.configs["allowed_special"],
        )
        for name, file in layout.WEIGHT_FILES.items():
            module = self.configs[name]
            module.load_state_dict(torch.load(model_dir / file, map_location="cpu"), strict=True)
            module.eval()
        self.llm, self.flow, self.hift = (
            self.configs["llm"],
            self.configs["flow"],
            self.configs["hift"],
        )
        self.sample_rate = self.configs["sample_rate"]
        self._model = None

    @property
    def model(self):
        if self._model is None:
            from cosyvoice.cli.model import CosyVoice2Model, CosyVoiceModel

            cls = CosyVoiceModel if self.version == 1 else CosyVoice2Model
            self._model = cls(self.llm, self.flow, self.hift)
            self._model.llm = self.llm  # minicpmo's CosyVoice2Model never sets it
        return self._model

    def text_tokens(self, text: str) -> int:
        return int(self.frontend.frontend_sft(text, tiny.SPEAKERS[0])["text"].shape[1])

    def speech_tokens(self, text: str, seed: int = 0) -> list[int]:
        """What CosyVoiceModel.llm_job feeds the LLM for an sft request, without the thread."""
        mi = self.frontend.frontend_sft(text, tiny.SPEAKERS[0])
        empty = torch.zeros(1, 0, dtype=torch.int32)
        torch.manual_seed(seed)
        return list(
            self.llm.inference(
                text=mi["text"],
                text_len=torch.tensor([mi["text"].shape[1]], dtype=torch.int32),
                prompt_text=empty,
                prompt_text_len=torch.tensor([0], dtype=torch.int32),
                prompt_speech_token=empty,
                prompt_speech_token_len=torch.tensor([0], dtype=torch.int32),
                embedding=mi["llm_embedding"],
            )
        )

    def tts(self, text: str, stream: bool, seed: int = 0) -> list:
        torch.manual_seed(seed)
        mi = self.frontend.frontend_sft(text, tiny.SPEAKERS[0])
        return [out["tts_speech"] for out in self.model.tts(**mi, stream=stream)]


@pytest.fixture(scope="session")
def tiny_model(cache_root):
    """``get(version, long=False) -> Loaded``, each built (through ensure_tiny_model) and loaded once."""
    loaded: dict = {}

    def get(version: int, long: bool = False) -> Loaded:
        if (version, long) not in loaded:
            loaded[version, long] = Loaded(tiny.ensure_tiny_model(cache_root, version, long=long), version)
        return loaded[version, long]

    return get


def qwen_decoding_sees_context(llm) -> bool:
    """Incremental decoding (the masks Qwen2LM.inference_wrapper passes) must match a full forward."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 6, llm.llm_input_size, generator=gen)
    with torch.no_grad():
        full, _ = llm.llm(x, torch.tensor([6]))
        _, cache = llm.llm.forward_one_step(x[:, :5], masks=torch.tril(torch.ones(1, 5, 5)).to(torch.bool))
        step, _ = llm.llm.forward_one_step(x[:, 5:], masks=torch.ones(1, 1, 1).to(torch.bool), cache=cache)
    return torch.allclose(full[:, -1], step[:, -1], atol=1e-3)


# --------------------------------------------------------------------------- layout and loading


@pytest.mark.parametrize("version", [1, 2])
def test_model_dir_loads_with_the_real_classes(tiny_model, version):
    from cosyvoice.cli.model import CosyVoice2Model, CosyVoiceModel
    from cosyvoice.utils.class_utils import get_model_type

    m = tiny_model(version)
    names = {p.name for p in m.dir.iterdir()}
    assert {
        layout.CONFIG_FILES[version],
        layout.SPEECH_TOKENIZER_FILES[version],
        *layout.WEIGHT_FILES.values(),
        layout.CAMPPLUS,
        layout.SPK2INFO,
    } <= names
    meta = json.loads((m.dir / layout.TINY_MARKER).read_text())
    assert meta == {
        "version": version,
        "seed": 0,
        "long": False,
        "instruct": False,
        "random_weights": True,
        "builder": tiny.BUILDER,
    }
    for key in (
        "llm",
        "flow",
        "hift",
        "get_tokenizer",
        "feat_extractor",
        "allowed_special",
        "sample_rate",
    ):
        assert key in m.configs
    assert m.sample_rate == {1: 22050, 2: 24000}[version]
    assert get_model_type(m.configs) is {1: CosyVoiceModel, 2: CosyVoice2Model}[version]
    assert set(m.frontend.spk2info) == set(tiny.SPEAKERS)
    for info in m.frontend.spk2info.values():
        assert tuple(info["embedding"].shape) == (1, 192)
    if version == 2:
        blank = m.dir / layout.QWEN_DIR
        # the files a released CosyVoice-BlankEN holds (Qwen2's tokenizer files, no tokenizer.json)
        assert {p.name for p in blank.iterdir()} == {"config.json", "generation_config.json", "model.safetensors",
                                                     *layout.QWEN_TOKENIZER_FILES}
        tok_config = json.loads((blank / "tokenizer_config.json").read_text())
        assert tok_config["tokenizer_class"] == "Qwen2Tokenizer"
        assert [t["content"] for t in tok_config["added_tokens_decoder"].values()] == list(layout.QWEN_SPECIALS[:3])
        assert type(m.frontend.tokenizer.tokenizer).__name__ == "Qwen2Tokenizer"
        assert 3000 <= len(m.frontend.tokenizer.tokenizer) <= 5000
        # the special tokens QwenTokenizer adds are single in-vocabulary tokens
        assert len(m.frontend.tokenizer.encode("<|endofprompt|>")) == 1
        assert m.flow.encoder.output_size() == 512
    total = sum(p.stat().st_size for p in m.dir.rglob("*") if p.is_file())
    assert total < {1: 20e6, 2: 80e6}[version]


def test_v1_yaml_needs_no_qwen_override(tiny_model):
    from hyperpyyaml import load_hyperpyyaml

    m = tiny_model(1)
    with _training_warnings_ignored(), open(m.dir / layout.CONFIG_FILES[1], encoding="utf-8") as f:
        assert "llm" in load_hyperpyyaml(f)


@contextlib.contextmanager
def _training_warnings_ignored():
    """A plain HyperPyYAML load builds HiFT's GAN discriminators (the loader never does): matcha's use torch's
    deprecated ``weight_norm``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.nn\.utils\.weight_norm` is deprecated",
                                category=FutureWarning)
        yield


@pytest.mark.parametrize("version", [1, 2])
def test_the_whole_config_builds_with_the_default_install(tiny_model, version):
    """As CosyVoice itself reads it: the GAN wrapper is built, the data pipeline resolves (without pyarrow/pyworld)."""
    import functools
    import importlib.util
    import sys

    from cosyvoice.hifigan.hifigan import HiFiGan
    from hyperpyyaml import load_hyperpyyaml

    m = tiny_model(version)
    overrides = {"qwen_pretrain_path": str(m.dir / layout.QWEN_DIR)} if version == 2 else None
    with tiny.preserved_rng(), _training_warnings_ignored(), open(m.dir / layout.CONFIG_FILES[version],
                                                                  encoding="utf-8") as f:
        configs = load_hyperpyyaml(f, overrides=overrides)
    assert isinstance(configs["hifigan"], HiFiGan) and configs["hifigan"].generator is configs["hift"]
    assert m.configs["hifigan"] is None  # what the loader reads: never built
    assert len(configs["data_pipeline"]) >= 10 and configs["train_conf"]["optim"] == "adam"
    tokenize = configs["tokenize"]
    assert isinstance(tokenize, functools.partial) and tokenize.keywords["get_tokenizer"] is configs["get_tokenizer"]
    if importlib.util.find_spec("pyarrow") is None:  # the default install: the training-only stand-in
        assert isinstance(sys.modules["cosyvoice.dataset.processor"], TrainingOnlyModule)
        for step in configs["data_pipeline"]:
            with pytest.raises(TrainingOnlyError, match="training data pipeline"):
                step([])


@pytest.mark.parametrize("version", [1, 2])
def test_onnx_stand_ins_match_what_the_frontend_expects(tiny_model, version):
    m = tiny_model(version)
    rng = np.random.default_rng(0)
    speech = torch.from_numpy((0.1 * rng.standard_normal(int(2.5 * 16000))).astype(np.float32)).unsqueeze(0)
    tokens, tokens_len = m.frontend._extract_speech_token(speech)
    frames = 2.5 * 100  # whisper log-mel frames
    assert abs(tokens.shape[1] - frames / {1: 2, 2: 4}[version]) <= 1
    assert int(tokens_len[0]) == tokens.shape[1]
    assert 0 <= int(tokens.min()) and int(tokens.max()) < m.llm.speech_token_size
    assert len(set(tokens[0].tolist())) > 10
    emb = m.frontend._extract_spk_embedding(speech)
    assert tuple(emb.shape) == (1, 192) and bool(torch.isfinite(emb).all()) and float(emb.norm()) > 0


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("version", [1, 2])
def test_weights_are_a_function_of_the_seed(tiny_model, cache_root, tmp_path, version):
    base = tiny_model(version).dir
    again = tiny.build_tiny_model(tmp_path / "again", version)
    other = tiny.ensure_tiny_model(cache_root, version, seed=1)
    files = sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(again)) for p in again.rglob("*") if p.is_file())
    assert [f for f in files if (base / f).read_bytes() != (again / f).read_bytes()] == []  # byte for byte
    for name in layout.WEIGHT_FILES.values():
        a, b, c = (torch.load(d / name, map_location="cpu") for d in (base, again, other))
        assert a.keys() == b.keys() == c.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), f"{name} differs between two builds with seed 0"
        assert not all(torch.equal(a[k], c[k]) for k in a), f"{name} is the same for seeds 0 and 1"


# --------------------------------------------------------------------------- LLM stop calibration


@pytest.mark.parametrize("version", [1, 2])
def test_short_model_stops_just_after_the_2x_minimum(tiny_model, version):
    m = tiny_model(version)
    n_text = m.text_tokens(SENTENCE)
    for seed in range(3):
        tokens = m.speech_tokens(SENTENCE, seed)
        assert 2 * n_text <= len(tokens) <= 2 * n_text + 20, (n_text, len(tokens))
        assert all(0 <= t < m.llm.speech_token_size for t in tokens)


@pytest.mark.parametrize("version", [1, 2])
def test_long_model_generates_many_tokens_but_stops_before_the_cap(tiny_model, version):
    m = tiny_model(version, long=True)
    n_text = m.text_tokens(SENTENCE)
    for seed in range(2):
        tokens = m.speech_tokens(SENTENCE, seed)
        assert 300 <= len(tokens) < 20 * n_text, (n_text, len(tokens))
        assert all(0 <= t < m.llm.speech_token_size for t in tokens)


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("version", [1, 2])
def test_tts_end_to_end(tiny_model, version):
    m = tiny_model(version)
    n_text = m.text_tokens(SENTENCE)
    for stream in (False, True):
        chunks = m.tts(SENTENCE, stream=stream)
        wav = torch.cat(chunks, dim=1)
        assert bool(torch.isfinite(wav).all()) and float(wav.abs().max()) > 0
        seconds = wav.shape[1] / m.sample_rate
        expected = 2 * n_text / TOKEN_RATE[version]
        assert 0.7 * expected <= seconds <= 1.3 * expected + 0.5, (seconds, expected)


@pytest.mark.parametrize("version", [1, 2])
def test_long_model_streams_several_chunks(tiny_model, version):
    m = tiny_model(version, long=True)
    # v2 re-runs the flow over every token per chunk; a short sentence keeps that cheap
    text = SENTENCE if version == 1 else SHORT_SENTENCE
    chunks = m.tts(text, stream=True)
    assert len(chunks) >= 3
    for c in chunks:
        assert c.shape[0] == 1 and bool(torch.isfinite(c).all())
    assert sum(c.shape[1] for c in chunks) / m.sample_rate > 2.0


def test_instruct_model(cache_root):
    d = tiny.ensure_tiny_model(cache_root, 1, instruct=True)
    assert layout.read_tiny_marker(d)["instruct"] is True
    m = Loaded(d, 1)
    mi = m.frontend.frontend_instruct(SENTENCE, tiny.SPEAKERS[1], "A calm, slow voice.")
    wav = torch.cat([o["tts_speech"] for o in m.model.tts(**mi, stream=False)], dim=1)
    assert bool(torch.isfinite(wav).all()) and wav.shape[1] > 0


# --------------------------------------------------------------------------- cache and API edges


def test_ensure_builds_once_under_concurrency_and_reuses(tmp_path):
    results: list = []
    errors: list = []

    def call() -> None:
        try:
            results.append(tiny.ensure_tiny_model(tmp_path, 1, seed=3))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2 and results[0] == results[1]
    built = results[0]
    assert built.parent == tmp_path and built.name.startswith("v1-short-seed3-")
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [built.name]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    stamp = (built / layout.WEIGHT_FILES["llm"]).stat().st_mtime_ns
    t0 = time.monotonic()
    assert tiny.ensure_tiny_model(tmp_path, 1, seed=3) == built
    assert time.monotonic() - t0 < 2.0
    assert (built / layout.WEIGHT_FILES["llm"]).stat().st_mtime_ns == stamp


def test_ensure_rebuilds_an_incomplete_dir(tmp_path):
    key_dir = tiny.ensure_tiny_model(tmp_path, 1, seed=4)
    (key_dir / layout.TINY_MARKER).unlink()
    (key_dir / "junk").write_text("x")
    again = tiny.ensure_tiny_model(tmp_path, 1, seed=4)
    assert again == key_dir and (again / layout.TINY_MARKER).exists() and not (again / "junk").exists()


def test_build_refuses_a_non_empty_dir_and_bad_arguments(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(FileExistsError):
        tiny.build_tiny_model(tmp_path, 1)
    assert (tmp_path / "x").read_text() == "keep me"
    with pytest.raises(ValueError):
        tiny.build_tiny_model(tmp_path / "a", 2, instruct=True)
    with pytest.raises(ValueError):
        tiny.build_tiny_model(tmp_path / "b", 4)


def test_version_availability(tmp_path):
    assert tiny.tiny_version_available(1) == (True, "")
    assert tiny.tiny_version_available(2) == (True, "")
    ok, why = tiny.tiny_version_available(3)
    # the installed distribution (cosyvoice-minicpmo) has no CosyVoice3 classes; an upstream checkout does
    # (tests/integration/upstream/test_upstream_checkout.py builds and serves a tiny v3 there)
    assert not ok and "no CosyVoice3 classes" in why and "engine.cosyvoice_path" in why
    with pytest.raises(RuntimeError) as err:
        tiny.build_tiny_model(tmp_path / "v3", 3)
    assert str(err.value) == why
    assert not (tmp_path / "v3").exists()  # refused before writing anything
    assert tiny.tiny_version_available(7)[0] is False


def test_make_tiny_model_v3_names_what_is_missing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "app.cli", "make-tiny-model", "--version", "3", str(tmp_path / "v3")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "COSYSERVE_ENGINE__COSYVOICE_PATH": ""})
    assert out.returncode == 2, out.stderr
    assert "cannot build a tiny CosyVoice3 model" in out.stderr and "no CosyVoice3 classes" in out.stderr
    assert "engine.cosyvoice_path" in out.stderr and not (tmp_path / "v3").exists()
    bad = subprocess.run([sys.executable, "-m", "app.cli", "make-tiny-model", "--version", "3", "--cosyvoice-path",
                          str(tmp_path / "nowhere"), str(tmp_path / "v3")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert bad.returncode == 2 and "does not contain a 'cosyvoice' package" in bad.stderr, bad.stderr


# --------------------------------------------------------------------------- known stack problems


def test_v2_incremental_decoding_sees_context(tiny_model):
    """transformers>=5 broke Qwen2Encoder's cached decoding mask; cosyvoice_compat restores it (real models too)."""
    assert qwen_decoding_sees_context(tiny_model(2).llm), QWEN_MASK_BUG


@pytest.mark.parametrize("version", [1, 2])
def test_a_built_dir_is_readable_by_any_user(cache_root, version):
    """Files 0644, dirs 0755: a dir built on a host must be readable by the image's uid 10001 when mounted.

    transformers' save_pretrained writes CosyVoice-BlankEN/model.safetensors 0600 by itself.
    """
    root = tiny.ensure_tiny_model(cache_root, version)
    modes = {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")]}
    wrong = {path: f"{mode:04o}" for path, mode in modes.items()
             if mode != (0o755 if (root / path).is_dir() else 0o644)}
    assert not wrong, wrong
    if version == 2:
        assert f"{layout.QWEN_DIR}/model.safetensors" in modes
