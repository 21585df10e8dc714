"""Every file a released model dir holds, in the form the release has it, as the loader treats it.

Upstream's frontend (``cosyvoice/cli/frontend.py``) and loader (``cosyvoice/cli/cosyvoice.py``)
read: the config (the data pipeline included: ``tests/integration/devmodels``), ``llm.pt`` /
``flow.pt`` / ``hift.pt``, ``campplus.onnx`` and ``speech_tokenizer_v*.onnx`` (each input fed by
POSITION, ``session.get_inputs()[i].name``: the names are whatever the export chose),
``spk2info.pt`` (``{speaker: {"embedding": [1, 192]}}``, plus entries ``save_spkinfo`` adds for
zero-shot speakers) and ``CosyVoice-BlankEN/`` (the builders write its released file set).
``flow.decoder.estimator.fp32.onnx`` is read only by upstream's TensorRT path (cosyserve's
``engine.flow_runtime: onnxruntime`` tries it: tests/integration/engines/cosyvoice/flow/test_onnx.py; the engines
here run the flow in torch), and ``llm.rl.pt`` (Fun-CosyVoice3's RL-tuned LLM) by nothing
upstream: cosyserve loads it when ``engine.llm_weights: rl`` says so.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

import torch

from app.engines.base import EngineFailure, PromptAudio, SynthesisRequest
from app.engines.cosyvoice import layout
from app.engines.cosyvoice.load import load_model_dir
from tests.support import configs
from tests.support.sounds import speechlike

PRESETS = ("中文女", "英文男")  # CosyVoice-300M-SFT's speaker ids are Chinese words


def _rename_onnx_inputs(path: Path, names: list[str]) -> None:
    import onnx

    model = onnx.load(str(path))
    for value, new in zip(model.graph.input, names, strict=True):
        old, value.name = value.name, new
        for node in model.graph.node:
            node.input[:] = [new if i == old else i for i in node.input]
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def released(tiny_models, tmp_path_factory) -> Path:
    """A tiny v2 dir made to look like a release: real-format spk2info, other ONNX input names, the extras."""
    model_dir = tmp_path_factory.mktemp("released") / "CosyVoice2-0.5B"
    shutil.copytree(tiny_models(2), model_dir)
    gen = torch.Generator().manual_seed(5)
    spk2info = {name: {"embedding": torch.randn(1, 192, generator=gen)} for name in PRESETS}
    spk2info["my_zero_shot"] = {  # what upstream's add_zero_shot_spk + save_spkinfo store: no "embedding"
        "prompt_text": torch.zeros(1, 4, dtype=torch.int32), "prompt_text_len": torch.tensor([4], dtype=torch.int32),
        "llm_prompt_speech_token": torch.zeros(1, 10, dtype=torch.int32),
        "flow_prompt_speech_token": torch.zeros(1, 10, dtype=torch.int32),
        "prompt_speech_feat": torch.zeros(1, 20, 80), "llm_embedding": torch.zeros(1, 192),
        "flow_embedding": torch.zeros(1, 192),
    }
    torch.save(spk2info, model_dir / layout.SPK2INFO)
    _rename_onnx_inputs(model_dir / layout.CAMPPLUS, ["input"])
    _rename_onnx_inputs(model_dir / layout.SPEECH_TOKENIZER_FILES[2], ["speech", "speech_lengths"])
    llm = torch.load(model_dir / layout.WEIGHT_FILES["llm"], map_location="cpu", weights_only=True)
    llm["llm_decoder.bias"] = llm["llm_decoder.bias"] + 0.5  # a different LLM of the same shapes
    torch.save(llm, model_dir / layout.LLM_WEIGHTS["rl"])
    for extra in (layout.FLOW_ESTIMATOR_ONNX, "speech_tokenizer_v2.batch.onnx", "configuration.json"):
        (model_dir / extra).write_bytes(b"not read by cosyserve")
    return model_dir


@pytest.fixture(scope="module")
def engine(released):
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    eng = CosyVoiceEngine(configs.engine(model_dir=str(released), torch_threads=1))
    eng.load()
    yield eng
    eng.close()


def test_spk2info_presets_in_the_released_form(engine):
    # the zero-shot entry upstream's save_spkinfo adds is no preset
    assert sorted(engine.voices()) == sorted(PRESETS)
    chunks = list(engine.synthesize(SynthesisRequest(text="Hello there, how are you?", mode="sft", speaker=PRESETS[0]),
                                    threading.Event()))
    assert chunks and sum(c.duration_s for c in chunks) > 0.2


def test_onnx_inputs_are_fed_by_position_whatever_their_names(engine, tiny_models):
    """The frontend feeds campplus and the speech tokenizer by position: renamed inputs give the same features."""
    import onnxruntime

    released = engine.loaded.model_dir
    names = [i.name for i in onnxruntime.InferenceSession(str(released / layout.CAMPPLUS)).get_inputs()]
    assert names == ["input"]
    speech = torch.from_numpy(speechlike(2.0)).unsqueeze(0)
    original = load_model_dir(tiny_models(2)).frontend
    tokens, _ = engine.loaded.frontend._extract_speech_token(speech)
    expected, _ = original._extract_speech_token(speech)
    assert torch.equal(tokens, expected) and tokens.shape[1] > 10
    assert torch.allclose(engine.loaded.frontend._extract_spk_embedding(speech),
                          original._extract_spk_embedding(speech))
    prompt = PromptAudio(speechlike(3.0), 16000)
    chunks = list(engine.synthesize(SynthesisRequest(text="Hello there.", mode="zero_shot", prompt_audio=prompt,
                                                     prompt_text="hello there my friend"), threading.Event()))
    pcm = np.concatenate([c.pcm for c in chunks])
    assert len(pcm) > 0.2 * engine.sample_rate and np.abs(pcm).max() > 0


def test_llm_rl_pt_is_loaded_only_when_asked(released, engine):
    base = torch.load(released / layout.WEIGHT_FILES["llm"], map_location="cpu", weights_only=True)
    rl = torch.load(released / layout.LLM_WEIGHTS["rl"], map_location="cpu", weights_only=True)
    assert torch.equal(engine.loaded.model.llm.llm_decoder.bias, base["llm_decoder.bias"])  # the default: llm.pt
    loaded = load_model_dir(released, llm_weights="rl")
    assert torch.equal(loaded.model.llm.llm_decoder.bias, rl["llm_decoder.bias"])
    assert not torch.equal(rl["llm_decoder.bias"], base["llm_decoder.bias"])


def test_llm_weights_is_a_setting_and_a_missing_rl_file_fails_at_once(tiny_models):
    assert configs.engine(tiny_models(2), llm_weights="rl").llm_weights == "rl"
    with pytest.raises(EngineFailure) as err:
        load_model_dir(tiny_models(2), llm_weights="rl")
    assert "has no llm.rl.pt" in str(err.value) and "engine.llm_weights" in str(err.value)
    with pytest.raises(EngineFailure, match="must be one of base, rl"):
        load_model_dir(tiny_models(2), llm_weights="dpo")


def test_a_config_naming_a_module_that_does_not_exist_fails_clearly(tiny_models, tmp_path):
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_models(1), model_dir)
    config = model_dir / layout.CONFIG_FILES[1]
    config.write_text(config.read_text() + "\nextra_step: !name:cosyvoice.dataset.no_such_module.step\n")
    with pytest.raises(EngineFailure) as err:
        load_model_dir(model_dir)
    message = str(err.value)
    assert message.startswith(f"{config} names something the CosyVoice in use")
    assert "cosyvoice.dataset.no_such_module.step" in message and "engine.cosyvoice_path" in message
