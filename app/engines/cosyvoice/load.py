"""Loading CosyVoice model dirs with the real CosyVoice classes.

We build the frontend and the model object ourselves instead of going through
``cosyvoice.cli.cosyvoice.CosyVoice*``: that way every supported distribution
gets the same, fully loaded result (llm, flow and hift weights loaded strictly
and in eval mode), nothing is downloaded, and ``modelscope`` is not needed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engines.base import EngineFailure
from app.engines.cosyvoice.compat import SafeMelExtractor, attach_llm, prepare_imports
from app.engines.cosyvoice.levers import (
    AppliedLevers,
    LeverRefused,
    Levers,
    apply_levers,
)
from app.engines.cosyvoice.precision import (
    DEFAULT_STAGES,
    Precision,
    apply_precision,
    resolve_precision,
)

log = logging.getLogger("cosyserve.engine")

# Building models is not thread-safe: transformers' from_pretrained constructs under a
# process-wide meta-device context, which leaks into modules other threads build meanwhile
# ("Cannot copy out of meta tensor"). Slots load one at a time; synthesis stays parallel.
_BUILD_LOCK = threading.Lock()

CONFIG_FILES = {1: "cosyvoice.yaml", 2: "cosyvoice2.yaml", 3: "cosyvoice3.yaml"}
TOKENIZER_FILES = {1: "speech_tokenizer_v1.onnx", 2: "speech_tokenizer_v2.onnx", 3: "speech_tokenizer_v3.onnx"}
MODEL_CLASSES = {1: "CosyVoiceModel", 2: "CosyVoice2Model", 3: "CosyVoice3Model"}


@dataclass
class LoadedModel:
    version: int
    frontend: Any
    model: Any
    sample_rate: int
    instruct: bool
    tiny: bool
    model_dir: Path
    precision: Precision = field(default_factory=lambda: Precision("fp32"))
    code_dir: str = ""  # where the imported ``cosyvoice`` package lives (installed copy or a checkout)
    levers: AppliedLevers = field(default_factory=AppliedLevers)  # int8 LLM, flow runtime, steps, CFG (levers.py)


def detect_version(model_dir: Path) -> int:
    found = [v for v, name in CONFIG_FILES.items() if (model_dir / name).is_file()]
    if not found:
        raise EngineFailure(
            f"{model_dir} is not a CosyVoice model dir: none of {', '.join(CONFIG_FILES.values())} found"
        )
    return max(found)


def read_tiny_marker(model_dir: Path) -> dict:
    marker = model_dir / "cosyserve_tiny.json"
    if not marker.is_file():
        return {}
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return {}


def _torch_load(path: Path, device: Any) -> dict:
    import torch

    if not path.is_file():
        raise EngineFailure(f"missing model file {path}")
    return torch.load(str(path), map_location=device, weights_only=True)


def load_model_dir(model_dir: str | os.PathLike, *, dtype: str = "fp32", dtype_stages: tuple[str, ...] = DEFAULT_STAGES,
                   cosyvoice_path: str | None = None, levers: Levers | None = None) -> LoadedModel:
    """Build frontend + model for the CosyVoice version found in ``model_dir`` (one thread at a time).

    ``dtype`` is ``engine.dtype`` (auto | fp32 | bf16 | fp16, see ``app/engines/cosyvoice/precision.py``);
    ``levers``: int8 LLM, flow runtime, steps, CFG (``app/engines/cosyvoice/levers.py``; None: none).
    """
    with _BUILD_LOCK:
        return _load_model_dir(model_dir, dtype=dtype, dtype_stages=tuple(dtype_stages), cosyvoice_path=cosyvoice_path,
                               levers=levers)


def _load_model_dir(model_dir: str | os.PathLike, *, dtype: str, dtype_stages: tuple[str, ...],
                    cosyvoice_path: str | None, levers: Levers | None = None) -> LoadedModel:
    prepare_imports(cosyvoice_path)
    import torch
    from hyperpyyaml import load_hyperpyyaml

    from cosyvoice.cli import model as cv_model
    from cosyvoice.cli.frontend import CosyVoiceFrontEnd

    model_dir = Path(model_dir).expanduser().resolve()
    if not model_dir.is_dir():
        raise EngineFailure(f"model dir {model_dir} does not exist")
    version = detect_version(model_dir)
    model_cls = getattr(cv_model, MODEL_CLASSES[version], None)
    if model_cls is None:
        raise EngineFailure(
            f"{model_dir} is a CosyVoice{version} model, but the installed CosyVoice "
            f"({Path(cv_model.__file__).parent.parent}) has no {MODEL_CLASSES[version]}; "
            "set engine.cosyvoice_path to an upstream CosyVoice checkout"
        )
    overrides = {}
    if version >= 2:
        overrides["qwen_pretrain_path"] = str(model_dir / "CosyVoice-BlankEN")
    with open(model_dir / CONFIG_FILES[version], encoding="utf-8") as f:
        configs = load_hyperpyyaml(f, overrides=overrides or None)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = resolve_precision(dtype, device.type, dtype_stages)
    llm, flow, hift = configs["llm"], configs["flow"], configs["hift"]
    # transformers 5 loads Qwen2 with dtype="auto" (bf16 for the real BlankEN config); pin fp32.
    llm.float()
    llm.load_state_dict(_torch_load(model_dir / "llm.pt", device), strict=True)
    flow.load_state_dict(_torch_load(model_dir / "flow.pt", device), strict=True)
    hift_state = {k.replace("generator.", ""): v for k, v in _torch_load(model_dir / "hift.pt", device).items()}
    hift.load_state_dict(hift_state, strict=True)
    for module in (llm, flow, hift):
        module.to(device).eval()
    apply_precision(precision, llm, flow, hift)
    applied = AppliedLevers()
    if levers is not None:
        try:
            applied = apply_levers(levers, llm=llm, flow=flow, version=version, device_type=device.type,
                                   llm_dtype=_stage_dtype(precision, "llm"), flow_dtype=_stage_dtype(precision, "flow"),
                                   model_dir=model_dir)
        except LeverRefused as exc:
            raise EngineFailure(str(exc)) from exc

    frontend = CosyVoiceFrontEnd(
        configs["get_tokenizer"],
        SafeMelExtractor(configs["feat_extractor"]),
        str(model_dir / "campplus.onnx"),
        str(model_dir / TOKENIZER_FILES[version]),
        str(model_dir / "spk2info.pt"),
        configs["allowed_special"],
    )
    model = model_cls(llm, flow, hift, precision.cuda_fp16)
    attach_llm(model, llm)
    marker = read_tiny_marker(model_dir)
    instruct = "-Instruct" in model_dir.name or bool(marker.get("instruct"))
    return LoadedModel(
        version=version,
        frontend=frontend,
        model=model,
        sample_rate=int(configs["sample_rate"]),
        instruct=instruct and version == 1,
        tiny=bool(marker.get("random_weights")),
        model_dir=model_dir,
        precision=precision,
        code_dir=str(Path(cv_model.__file__).resolve().parent.parent),
        levers=applied,
    )


def _stage_dtype(precision: Precision, stage: str) -> str:
    return precision.dtype if precision.reduced and stage in precision.stages else "fp32"
