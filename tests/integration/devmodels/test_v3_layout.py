"""A Fun-CosyVoice3-0.5B dir laid out as upstream publishes it is recognised as CosyVoice3.

``FunAudioLLM/Fun-CosyVoice3-0.5B-2512`` holds the files upstream's ``CosyVoice3`` loader
opens (``cosyvoice3.yaml``, ``llm.pt``, ``flow.pt``, ``hift.pt``, ``campplus.onnx``,
``speech_tokenizer_v3.onnx``, ``spk2info.pt``, ``CosyVoice-BlankEN/``) next to extras it
ships for other runtimes and variants (the RL LLM ``llm.rl.pt``, the flow estimator as
ONNX for TensorRT, the batch speech tokenizer, model-card files). The installed CosyVoice
has no v3 classes, so here loading stops with an error naming what is missing; the same
layout loads and speaks on an upstream checkout (``test_upstream_checkout.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engines.base import EngineFailure
from app.engines.cosyvoice.layout import detect_version
from app.engines.cosyvoice.load import load_model_dir
from app.settings import EngineSettings, batches_llm
from tests.support.paths import PUBLISHED_V3

pytestmark = pytest.mark.integration

def published_layout(root: Path) -> Path:
    for name in PUBLISHED_V3:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"placeholder")
    return root


def test_published_v3_layout_is_recognised(tmp_path):
    model_dir = published_layout(tmp_path / "Fun-CosyVoice3-0.5B")
    assert detect_version(model_dir) == 3
    assert batches_llm(EngineSettings(model_dir=str(model_dir)))  # the batched LLM path, as for v2
    assert not batches_llm(EngineSettings(model_dir=str(model_dir), batching=False))
    with pytest.raises(EngineFailure) as err:
        load_model_dir(model_dir)
    message = str(err.value)
    assert "is a CosyVoice3 model" in message and "no CosyVoice3Model" in message
    assert "engine.cosyvoice_path" in message


def test_v2_files_beside_a_v3_yaml_still_mean_v3(tmp_path):
    model_dir = published_layout(tmp_path / "m")
    (model_dir / "cosyvoice2.yaml").write_text("# left over\n")
    assert detect_version(model_dir) == 3
    (model_dir / "cosyvoice3.yaml").unlink()
    assert detect_version(model_dir) == 2
