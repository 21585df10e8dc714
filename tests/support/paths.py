"""Where things are: the repository root, the tiny test models' cache, a published v3 dir's files."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("COSYSERVE_TEST_MODELS", ROOT / ".cache" / "models"))
# The files FunAudioLLM/Fun-CosyVoice3-0.5B-2512 publishes: those upstream's loader opens and the extras.
PUBLISHED_V3 = (
    "cosyvoice3.yaml", "llm.pt", "llm.rl.pt", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v3.onnx",
    "speech_tokenizer_v3.batch.onnx", "flow.decoder.estimator.fp32.onnx", "spk2info.pt", "configuration.json",
    "README.md", "CosyVoice-BlankEN/config.json", "CosyVoice-BlankEN/generation_config.json",
    "CosyVoice-BlankEN/merges.txt", "CosyVoice-BlankEN/model.safetensors", "CosyVoice-BlankEN/tokenizer_config.json",
    "CosyVoice-BlankEN/vocab.json", "asset/dingding.png",
)
