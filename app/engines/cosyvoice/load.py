"""Loading CosyVoice model dirs with the real CosyVoice classes.

We build the frontend and the model object ourselves instead of going through
``cosyvoice.cli.cosyvoice.CosyVoice*``: that way every supported distribution
gets the same, fully loaded result (llm, flow and hift weights loaded strictly
and in eval mode), nothing is downloaded, and ``modelscope`` is not needed.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engines.base import EngineFailure
from app.engines.cosyvoice.device import describe_device, resolve_device
from app.engines.cosyvoice.layout import (
    CAMPPLUS,
    CONFIG_FILES,
    LLM_WEIGHTS,
    MODEL_CLASSES,
    SPEECH_TOKENIZER_FILES,
    SPK2INFO,
    WEIGHT_FILES,
    detect_version,
    read_tiny_marker,
    unreadable,
)
from app.engines.cosyvoice.levers import (
    AppliedLevers,
    LeverRefused,
    Levers,
    apply_levers,
)
from app.engines.cosyvoice.model_config import read_model_config
from app.engines.cosyvoice.precision import (
    DEFAULT_STAGES,
    Precision,
    apply_precision,
    resolve_precision,
)
from app.engines.cosyvoice.shims import SafeMelExtractor, attach_llm, prepare_imports

log = logging.getLogger("cosyserve.engine")

# Building models is not thread-safe: transformers' from_pretrained constructs under a
# process-wide meta-device context, which leaks into modules other threads build meanwhile
# ("Cannot copy out of meta tensor"). Slots load one at a time; synthesis stays parallel.
_BUILD_LOCK = threading.Lock()


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
    device: Any = "cpu"  # the torch.device every module and input lives on
    device_info: dict = field(default_factory=dict)  # name, compute capability, CUDA/driver versions (load log)
    code_dir: str = ""  # where the imported ``cosyvoice`` package lives (installed copy or a checkout)
    levers: AppliedLevers = field(default_factory=AppliedLevers)  # int8 LLM, flow runtime, steps, CFG (levers.py)


def _torch_load(path: Path, device: Any) -> dict:
    import torch

    if not path.is_file():
        raise EngineFailure(f"missing model file {path}")
    return torch.load(str(path), map_location=device, weights_only=True)


def load_model_dir(model_dir: str | os.PathLike, *, dtype: str = "fp32", dtype_stages: tuple[str, ...] = DEFAULT_STAGES,
                   cosyvoice_path: str | None = None, device: str = "auto",
                   levers: Levers | None = None, llm_weights: str = "base") -> LoadedModel:
    """Build frontend + model for the CosyVoice version found in ``model_dir`` (one thread at a time).

    ``dtype`` is ``engine.dtype`` (auto | fp32 | bf16 | fp16, see ``app/engines/cosyvoice/precision.py``);
    ``device`` is ``engine.device`` (auto | cpu | cuda | cuda:N, see ``app/engines/cosyvoice/device.py``);
    ``levers``: int8 LLM, flow runtime, steps, CFG (``app/engines/cosyvoice/levers.py``; None: none);
    ``llm_weights`` is ``engine.llm_weights`` (base: ``llm.pt``; rl: ``llm.rl.pt``, ``layout.LLM_WEIGHTS``).
    """
    target = resolve_device(device)  # before anything heavy: a missing GPU fails at once
    with _BUILD_LOCK:
        return _load_model_dir(model_dir, dtype=dtype, dtype_stages=tuple(dtype_stages), cosyvoice_path=cosyvoice_path,
                               device=target, levers=levers, llm_weights=llm_weights)


def _llm_weights_file(model_dir: Path, llm_weights: str) -> Path:
    if llm_weights not in LLM_WEIGHTS:
        raise EngineFailure(f"engine.llm_weights must be one of {', '.join(LLM_WEIGHTS)}, not {llm_weights!r}")
    path = model_dir / LLM_WEIGHTS[llm_weights]
    if llm_weights != "base" and not path.is_file():
        raise EngineFailure(f"engine.llm_weights is {llm_weights!r}, but {model_dir} has no {path.name} "
                            f"(Fun-CosyVoice3-0.5B-2512 ships one; set engine.llm_weights: base for {LLM_WEIGHTS['base']})")
    return path


def _load_model_dir(model_dir: str | os.PathLike, *, dtype: str, dtype_stages: tuple[str, ...],
                    cosyvoice_path: str | None, device: Any, levers: Levers | None = None,
                    llm_weights: str = "base") -> LoadedModel:
    prepare_imports(cosyvoice_path)

    from cosyvoice.cli import model as cv_model
    from cosyvoice.cli.frontend import CosyVoiceFrontEnd

    model_dir = Path(model_dir).expanduser().resolve()
    if not model_dir.is_dir():
        raise EngineFailure(f"model dir {model_dir} does not exist")
    denied = unreadable(model_dir)
    if denied:
        raise EngineFailure(denied)
    version = detect_version(model_dir)
    llm_path = _llm_weights_file(model_dir, llm_weights)  # before anything heavy: a missing file fails at once
    model_cls = getattr(cv_model, MODEL_CLASSES[version], None)
    if model_cls is None:
        raise EngineFailure(
            f"{model_dir} is a CosyVoice{version} model, but the installed CosyVoice "
            f"({Path(cv_model.__file__).parent.parent}) has no {MODEL_CLASSES[version]}; "
            "set engine.cosyvoice_path to an upstream CosyVoice checkout"
        )
    config_path = model_dir / CONFIG_FILES[version]
    with open(config_path, encoding="utf-8") as f:
        configs = read_model_config(f, model_dir=model_dir, version=version, name=str(config_path))

    precision = resolve_precision(dtype, device.type, dtype_stages)
    llm, flow, hift = configs["llm"], configs["flow"], configs["hift"]
    # transformers 5 loads Qwen2 with dtype="auto" (bf16 for the real BlankEN config); pin fp32.
    llm.float()
    llm.load_state_dict(_torch_load(llm_path, device), strict=True)
    if llm_weights != "base":
        log.info("LLM weights from %s (engine.llm_weights: %s)", llm_path.name, llm_weights)
    flow.load_state_dict(_torch_load(model_dir / WEIGHT_FILES["flow"], device), strict=True)
    hift_state = _torch_load(model_dir / WEIGHT_FILES["hift"], device)
    hift.load_state_dict({k.replace("generator.", ""): v for k, v in hift_state.items()}, strict=True)
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
        str(model_dir / CAMPPLUS),
        str(model_dir / SPEECH_TOKENIZER_FILES[version]),
        str(model_dir / SPK2INFO),
        configs["allowed_special"],
    )
    # fp16=False: CosyVoice's own flag would .half() the flow (some copies) and autocast HiFT (v3);
    # apply_precision above did what engine.dtype asks
    model = model_cls(llm, flow, hift, False)
    # CosyVoice's classes pick "cuda if available" themselves: put them on the device we chose
    model.device = device
    frontend.device = device
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
        device=device,
        device_info=describe_device(device),
        code_dir=str(Path(cv_model.__file__).resolve().parent.parent),
        levers=applied,
    )


def _stage_dtype(precision: Precision, stage: str) -> str:
    return precision.dtype if precision.reduced and stage in precision.stages else "fp32"
