"""Tiny random-weight CosyVoice model dirs, built from the real CosyVoice classes.

Tests and local development need a model dir that the real loading code accepts (the files
``app/engines/cosyvoice/layout.py`` names: the HyperPyYAML config, ``llm.pt``/``flow.pt``/
``hift.pt`` state dicts, the two ONNX front-end models, ``spk2info.pt``, and for v2/v3 a Qwen2
``CosyVoice-BlankEN`` dir) but is small enough to build in seconds and run faster than real
time on a CPU. The weights are random, so the audio is noise; the shapes, code paths and
timing behaviour (streaming chunks, stop conditions) are the real ones.

This module drives the build; the parts are ``configs.py`` (the config, from ``templates/``),
``blanken.py`` (the Qwen2 dir and its tokenizer), ``onnx_stubs.py`` (the ONNX stand-ins) and
``stop.py``. Random weights never emit end-of-speech, so the builder wires an exact stop
controller into the random LLM (``stop.py``): short models stop right after the
2x-text-tokens minimum, long ones at ~15x (v1) / ~9.5x (v2, v3) the prefix length.
CosyVoice3 needs a CosyVoice with the v3 classes, e.g. an upstream checkout passed as
``cosyvoice_path``.

``full_size=True`` (v2 only) writes CosyVoice2-0.5B's real dimensions instead, with a
calibrated output head in place of the stop controller (``fullsize.py``): ~4.5 GB.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.util
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.devmodels import blanken, configs, fullsize, onnx_stubs
from app.devmodels.stop import StopPlan
from app.engines.cosyvoice import layout
from app.engines.cosyvoice.model_config import read_model_config
from app.engines.cosyvoice.shims import prepare_imports

log = logging.getLogger("cosyserve.engine.tiny")

SPEAKERS: tuple[str, ...] = ("tiny_female", "tiny_male")
BUILDER = 4  # bump whenever the files written here change
_TOKEN_STRIDE = {1: 2, 2: 4, 3: 4}  # mel frames (100 Hz) per speech token
# long=True: the LLM stops once context length / prefix length passes this. A 20-word
# English sentence is 21 whisper tokens (v1) / ~37 tiny-BPE tokens (v2): ~336 / ~320
# speech tokens. v2 streaming re-runs the flow over all tokens per chunk, so it gets less.
_LONG_STOP_RATIO = {1: 15.0, 2: 9.5, 3: 9.5}

# --------------------------------------------------------------------------- availability


def _cosyvoice_location() -> str:
    spec = importlib.util.find_spec("cosyvoice")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return str(next(iter(spec.submodule_search_locations)))


def tiny_version_available(version: int, cosyvoice_path: str | None = None) -> tuple[bool, str]:
    """Whether this process can build (and run) a tiny model of CosyVoice ``version``.

    ``cosyvoice_path``: an upstream checkout to import CosyVoice from (``engine.cosyvoice_path``).
    """
    try:
        prepare_imports(cosyvoice_path)  # cosyvoice/matcha importable, with our shims
    except (FileNotFoundError, ImportError) as exc:
        return False, str(exc)
    where = _cosyvoice_location()
    if not where:
        return (
            False,
            "CosyVoice is not installed (no importable 'cosyvoice' package); run `make setup`",
        )
    if version in (1, 2):
        return True, ""
    if version == 3:
        try:
            importlib.import_module("cosyvoice.llm.llm").CosyVoice3LM  # noqa: B018
            importlib.import_module("cosyvoice.cli.model").CosyVoice3Model  # noqa: B018
        except (ImportError, AttributeError):
            return False, (
                f"installed CosyVoice ({where}) has no CosyVoice3 classes; "
                "point engine.cosyvoice_path (or COSYSERVE_ENGINE__COSYVOICE_PATH) at an upstream checkout"
            )
        return True, ""
    return False, f"unknown CosyVoice version {version!r} (expected 1, 2 or 3)"


# --------------------------------------------------------------------------- public API


def build_tiny_model(
    out_dir: str | os.PathLike,
    version: int,
    *,
    long: bool = False,
    instruct: bool = False,
    seed: int = 0,
    full_size: bool = False,
    cosyvoice_path: str | None = None,
) -> Path:
    """Write a complete tiny CosyVoice model dir for ``version`` into ``out_dir``.

    ``full_size``: CosyVoice2 (v2) only, with CosyVoice2-0.5B's real dimensions (see ``fullsize.py``).
    CosyVoice3 needs a CosyVoice with the v3 classes (an upstream checkout on ``sys.path``).
    """
    if version == 3:
        ok, why = tiny_version_available(3, cosyvoice_path)
        if not ok:
            raise RuntimeError(why)
    if version not in layout.CONFIG_FILES:
        raise ValueError(f"unknown CosyVoice version {version!r} (expected 1, 2 or 3)")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if instruct and version != 1:
        raise ValueError("instruct=True is only meaningful for CosyVoice v1 (CosyVoice-300M-Instruct)")
    if full_size and (version != 2 or long):
        raise ValueError("full_size=True builds CosyVoice2 (version 2) only, and not with long=True")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"refusing to build a tiny model into non-empty {out}")
    out.mkdir(parents=True, exist_ok=True)
    prepare_imports(cosyvoice_path)
    import torch

    with preserved_rng(), _torch_threads(2), _quiet_transformers():
        torch.manual_seed(seed)
        if version >= 2:
            blanken.write_blanken(out / layout.QWEN_DIR, seed, version=version, full_size=full_size)
        yaml_text = configs.render_yaml(version, full_size=full_size)
        config_path = out / layout.CONFIG_FILES[version]
        config_path.write_text(yaml_text, encoding="utf-8")
        modules = read_model_config(yaml_text, model_dir=out, version=version, name=str(config_path))
        llm, flow, hift = modules["llm"], modules["flow"], modules["hift"]
        llm.float()  # a full-size BlankEN is stored in bf16 (like the real one); llm.pt is fp32
        for i, module in enumerate((llm, flow, hift)):
            _reseed(
                module,
                torch.Generator().manual_seed(seed * 7919 + 101 * (i + 1) + version),
            )
        plan = StopPlan(
            long=long,
            gen=torch.Generator().manual_seed(seed * 7919 + 17 + version),
            stop_ratio=_LONG_STOP_RATIO[version],
        )
        if version == 1:
            plan.install_v1(llm)
        elif full_size:
            fullsize.calibrate_decoder(llm, torch.Generator().manual_seed(seed * 7919 + 29))
        else:
            plan.install_v3(llm) if version == 3 else plan.install_v2(llm)
            llm.llm.model.save_pretrained(str(out / layout.QWEN_DIR))  # keep the safetensors == llm.pt
        torch.save(llm.state_dict(), out / layout.WEIGHT_FILES["llm"])
        if full_size:  # the safetensors == llm.pt up to bf16 rounding; llm.pt (loaded strictly) wins
            llm.llm.model.to(torch.bfloat16).save_pretrained(str(out / layout.QWEN_DIR))
        torch.save(flow.state_dict(), out / layout.WEIGHT_FILES["flow"])
        torch.save(hift.state_dict(), out / layout.WEIGHT_FILES["hift"])
        gen = torch.Generator().manual_seed(seed * 7919 + 3)
        onnx_stubs.write_campplus(out / layout.CAMPPLUS, gen)
        onnx_stubs.write_speech_tokenizer(
            out / layout.SPEECH_TOKENIZER_FILES[version],
            _TOKEN_STRIDE[version],
            configs.SPEECH_VOCAB[version],
            gen,
        )
        spk = {}
        for name in SPEAKERS:
            emb = torch.randn(1, 192, generator=gen)
            spk[name] = {"embedding": emb * (10.0 / emb.norm())}
        torch.save(spk, out / layout.SPK2INFO)
    meta = {
        "version": version,
        "seed": seed,
        "long": long,
        "instruct": instruct,
        "random_weights": True,
        "builder": BUILDER,
    }
    if full_size:
        meta["full_size"] = True
    _world_readable(out)
    layout.write_tiny_marker(out, meta)  # written last: marks the dir complete
    return out


def ensure_tiny_model(
    cache_root: str | os.PathLike,
    version: int,
    *,
    long: bool = False,
    instruct: bool = False,
    seed: int = 0,
    cosyvoice_path: str | None = None,
) -> Path:
    """Return ``cache_root/<key>``, building it once (atomic, safe across processes)."""
    root = Path(cache_root)
    root.mkdir(parents=True, exist_ok=True)
    key = f"v{version}-{'long' if long else 'short'}{'-instruct' if instruct else ''}-seed{seed}-b{BUILDER}"
    final = root / key
    want = {
        "version": version,
        "seed": seed,
        "long": long,
        "instruct": instruct,
        "builder": BUILDER,
    }
    if _is_complete(final, want):
        return final
    with open(root / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _is_complete(final, want):
                return final
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root))
            try:
                started = time.monotonic()
                build_tiny_model(tmp, version, long=long, instruct=instruct, seed=seed, cosyvoice_path=cosyvoice_path)
                os.chmod(tmp, 0o755)  # mkdtemp made it 0700
                if final.exists():  # stale or from another builder number
                    stale = Path(tempfile.mkdtemp(prefix=f".{key}.old-", dir=root))
                    os.rename(final, stale / "dir")
                    shutil.rmtree(stale, ignore_errors=True)
                os.rename(tmp, final)
                log.info("built tiny CosyVoice v%d model %s in %.1fs", version, final, time.monotonic() - started)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


def _is_complete(path: Path, want: dict[str, Any]) -> bool:
    meta = layout.read_tiny_marker(path)
    return all(meta.get(k) == v for k, v in want.items())


# --------------------------------------------------------------------------- helpers


def _world_readable(root: Path) -> None:
    """Files 0644, dirs 0755, whatever the umask and the writers chose.

    transformers' ``save_pretrained`` leaves ``model.safetensors`` at 0600; a dir built on a host
    and mounted into the image (which runs as uid 10001) must be readable by another user.
    """
    root.chmod(0o755)
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """CosyVoice's constructors reseed the global RNGs (CausalConditionalCFM): undo that."""
    import numpy as np
    import torch

    py, npy, th = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(th)


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    if before > n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No "Loading weights"/"Writing model shards" progress bars while building."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _reseed(module: Any, gen: Any) -> None:
    """Redraw every randomly initialised parameter from ``gen``, keeping its mean and std.

    Constructors draw from the global RNG (and CosyVoice2's CFM resets it to 0), so
    we make the weights a function of the seed only. Constant parameters (norm
    gains, zero biases) and weight-norm magnitudes are kept.
    """
    import torch

    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.numel() < 2 or name.endswith(("original0", "weight_g")):
                continue
            std = p.float().std()
            if not torch.isfinite(std) or float(std) == 0.0:
                continue
            p.copy_(torch.randn(p.shape, generator=gen) * std + p.float().mean())
