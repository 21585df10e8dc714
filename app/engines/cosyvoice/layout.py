"""The files of a CosyVoice model dir and the ids they fix: the one contract of the loader and the builders.

The loader (``load.py``) opens these files; the random-weight builders (``app/devmodels/``)
write them; the batched LLM checks the end-of-prompt id. Each name is defined here once.
A released dir (e.g. ``FunAudioLLM/CosyVoice2-0.5B``) holds::

    cosyvoice2.yaml                    the HyperPyYAML config (v1: cosyvoice.yaml, v3: cosyvoice3.yaml)
    llm.pt  flow.pt  hift.pt           state dicts of the config's llm / flow / hift
    campplus.onnx                      speaker embedding: fbank [1, T, 80] -> [1, 192]
    speech_tokenizer_v2.onnx           speech tokenizer (v1: _v1, v3: _v3)
    spk2info.pt                        {speaker id: {"embedding": [1, 192], ...}}
    CosyVoice-BlankEN/                 v2/v3: the Qwen2 config, weights and text tokenizer

plus files cosyserve reads only when asked: ``llm.rl.pt`` (:data:`LLM_WEIGHTS`) and
``flow.decoder.estimator.fp32.onnx`` (:data:`FLOW_ESTIMATOR_ONNX`, the flow estimator upstream
turns into a TensorRT engine; ``engine.flow_runtime: onnxruntime`` runs it if it matches the
loaded weights), or not at all (``speech_tokenizer_v3.batch.onnx``, model-card files). The
front-end ONNX files' inputs are fed by position, whatever their names. A dir built by ``cosyserve make-tiny-model`` also holds
``cosyserve_tiny.json`` (:data:`TINY_MARKER`), written last, which says how it was built.

Pure Python (no torch, no CosyVoice): the config and the CLI may import it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.engines.base import EngineFailure

# -- per version -------------------------------------------------------------------------------
CONFIG_FILES = {1: "cosyvoice.yaml", 2: "cosyvoice2.yaml", 3: "cosyvoice3.yaml"}
SPEECH_TOKENIZER_FILES = {
    1: "speech_tokenizer_v1.onnx",
    2: "speech_tokenizer_v2.onnx",
    3: "speech_tokenizer_v3.onnx",
}
MODEL_CLASSES = {1: "CosyVoiceModel", 2: "CosyVoice2Model", 3: "CosyVoice3Model"}  # in cosyvoice.cli.model

# -- every version -----------------------------------------------------------------------------
WEIGHT_FILES = {"llm": "llm.pt", "flow": "flow.pt", "hift": "hift.pt"}  # keyed by the config's module
# Fun-CosyVoice3-0.5B-2512 also ships llm.rl.pt: its RL-tuned LLM, the same shapes as llm.pt.
# Upstream's loader reads llm.pt only; engine.llm_weights picks one (base: llm.pt).
LLM_WEIGHTS = {"base": WEIGHT_FILES["llm"], "rl": "llm.rl.pt"}
# The flow's estimator exported by upstream (inputs x, mask, mu, t, spks, cond; batch 2) for its
# TensorRT path; flow/onnx.py serves it on ONNX Runtime when it matches the loaded weights.
FLOW_ESTIMATOR_ONNX = "flow.decoder.estimator.fp32.onnx"
CAMPPLUS = "campplus.onnx"
SPK2INFO = "spk2info.pt"
QWEN_DIR = "CosyVoice-BlankEN"  # v2/v3: the config's qwen_pretrain_path points here
# What a released QWEN_DIR holds for its text tokenizer (Qwen2's files, read by transformers'
# AutoTokenizer inside CosyVoice's tokenizer; no tokenizer.json), next to config.json,
# generation_config.json and model.safetensors.
QWEN_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
TINY_MARKER = "cosyserve_tiny.json"

# -- the config's entries ----------------------------------------------------------------------
QWEN_PATH_ENTRY = "qwen_pretrain_path"  # v2/v3: '' in released configs; the loader points it at QWEN_DIR
# Built by a released config only for training: the GAN wrapper around HiFT (a ~41 M-parameter
# discriminator). The loader replaces them with null before anything is built (model_config.py).
TRAINING_ONLY_ENTRIES = ("hifigan",)

# -- text ids ----------------------------------------------------------------------------------
ENDOFPROMPT = "<|endofprompt|>"
ENDOFPROMPT_ID = 151646  # CosyVoice3's LLM asserts this text id is in the text or the prompt text
# CosyVoice3's text tokenizer numbers these right after Qwen2's 151643 ordinary entries.
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", ENDOFPROMPT)
QWEN_SPECIALS_START = ENDOFPROMPT_ID - QWEN_SPECIALS.index(ENDOFPROMPT)


def find_version(model_dir: Path) -> int | None:
    """The CosyVoice version whose config ``model_dir`` holds (the newest, if several), or None."""
    found = [v for v, name in CONFIG_FILES.items() if (model_dir / name).is_file()]
    return max(found) if found else None


def detect_version(model_dir: Path) -> int:
    """Like :func:`find_version`, but a dir without any config is an :class:`EngineFailure`."""
    version = find_version(model_dir)
    if version is None:
        raise EngineFailure(
            f"{model_dir} is not a CosyVoice model dir: none of {', '.join(CONFIG_FILES.values())} found"
        )
    return version


def unreadable(model_dir: Path) -> str | None:
    """One line naming the first file or dir under ``model_dir`` this process may not read, or None.

    Hidden entries (``.git``, a hub client's ``.msc``) are passed over: the loader opens none of them.
    A dir built on a host and mounted into an image that runs as another uid fails here, at startup,
    as "permission denied" with the path and the uid, rather than deep in a loader.
    """
    def denied(path: Path) -> str:
        try:
            st = path.stat()
            what = f"mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid} gid {st.st_gid}"
        except OSError as exc:
            what = exc.strerror or "cannot stat"
        return (f"permission denied: {path} ({what}) is not readable by uid {os.getuid()} gid {os.getgid()}, "
                f"which cosyserve runs as: make the model dir readable (chmod -R a+rX {model_dir})")

    if not os.access(model_dir, os.R_OK | os.X_OK):
        return denied(model_dir)
    for parent, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(dirs):
            if not os.access(os.path.join(parent, name), os.R_OK | os.X_OK):
                return denied(Path(parent, name))
        for name in sorted(files):
            if not name.startswith(".") and not os.access(os.path.join(parent, name), os.R_OK):
                return denied(Path(parent, name))
    return None


def files_fingerprint(model_dir: Path, head_bytes: int = 1 << 20) -> str:
    """A hash of a model dir's files: each one's relative path, size and first ``head_bytes`` (dot files and
    dot dirs skipped). Two copies of one release agree; changed weights (another size or head) do not."""
    h = hashlib.sha256()
    for parent, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            path = Path(parent, name)
            h.update(f"{path.relative_to(model_dir)}\0{path.stat().st_size}\0".encode())
            with open(path, "rb") as f:
                h.update(f.read(head_bytes))
    return h.hexdigest()[:32]


def read_tiny_marker(model_dir: Path) -> dict[str, Any]:
    """What the builder wrote into :data:`TINY_MARKER`; ``{}`` if it is missing, unreadable or not an object."""
    try:
        meta = json.loads((model_dir / TINY_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def write_tiny_marker(model_dir: Path, meta: Mapping[str, Any]) -> None:
    """Write :data:`TINY_MARKER` (the builders write it last: its presence marks a complete dir)."""
    (model_dir / TINY_MARKER).write_text(json.dumps(dict(meta), indent=2) + "\n", encoding="utf-8")
