"""Reading a model dir's HyperPyYAML config: what the loader and the random-weight builders build from it.

A released dir's config is upstream's training config. Besides what inference reads (``llm``,
``flow``, ``hift``, ``get_tokenizer``, ``feat_extractor``, ``allowed_special``,
``sample_rate``) it holds the training data pipeline (``!name:cosyvoice.dataset.processor.*``,
which ``shims.prepare_imports`` makes importable), the optimiser settings, and the GAN wrapper
used to train HiFT (``hifigan: !new:...HiFiGan`` around a ~41 M-parameter discriminator).
:func:`read_model_config` loads it as CosyVoice does, except that the entries of
``layout.TRAINING_ONLY_ENTRIES`` are replaced by ``null`` before anything is built (HyperPyYAML
applies overrides to the text, so the discriminator is never constructed: ~0.8 s and ~160 MB
less per load), and a name that does not import becomes an :class:`EngineFailure` naming the
config and the CosyVoice in use.
"""

from __future__ import annotations

import importlib.util
import pydoc
import re
from pathlib import Path
from typing import IO, Any

from app.engines.base import EngineFailure
from app.engines.cosyvoice.layout import (
    QWEN_DIR,
    QWEN_PATH_ENTRY,
    TRAINING_ONLY_ENTRIES,
)


def config_overrides(model_dir: Path, version: int) -> dict[str, Any]:
    """What replaces the config's own values: the Qwen2 dir inside ``model_dir`` (v2/v3), no training-only entries."""
    overrides: dict[str, Any] = {key: None for key in TRAINING_ONLY_ENTRIES}
    if version >= 2:
        overrides[QWEN_PATH_ENTRY] = str(model_dir / QWEN_DIR)
    return overrides


def read_model_config(source: str | IO[str], *, model_dir: Path, version: int, name: str) -> dict[str, Any]:
    """Build the config ``source`` (its text, or an open file) of the CosyVoice ``version`` dir ``model_dir``.

    ``name`` says which config it is in errors (its path). Needs ``shims.prepare_imports`` first.
    """
    from hyperpyyaml import load_hyperpyyaml

    try:
        return load_hyperpyyaml(source, overrides=config_overrides(model_dir, version), overrides_must_match=False)
    except pydoc.ErrorDuringImport as exc:  # the module exists, but importing it raised
        raise EngineFailure(f"{name}: importing {exc.filename} failed: {exc.exc.__name__}: {exc.value}") from exc
    except ImportError as exc:
        if not str(exc).startswith("There is no such"):  # HyperPyYAML's words for a name that does not resolve
            raise EngineFailure(f"{name}: {type(exc).__name__}: {exc}") from exc
        raise EngineFailure(
            f"{name} names something the CosyVoice in use ({_cosyvoice_dir()}) does not have: {exc}. "
            "A config written for another CosyVoice needs that one: set engine.cosyvoice_path to an upstream checkout"
        ) from exc


_TAGGED = re.compile(r"!(?:new|name|apply|applyref|module):([A-Za-z_][\w.]*)")


def named_objects(text: str) -> list[str]:
    """Every Python name a config's HyperPyYAML tags (``!new:``, ``!name:``, ``!apply:``, ...) refer to, once each."""
    return list(dict.fromkeys(_TAGGED.findall(text)))


def served_objects(text: str) -> list[str]:
    """The names of :func:`named_objects` that :func:`read_model_config` imports: none only under a training-only entry.

    HyperPyYAML applies the loader's overrides to the text before it resolves a tag, so a name that
    appears only inside ``layout.TRAINING_ONLY_ENTRIES`` (the HiFT GAN wrapper: HiFiGan and its
    discriminators, whose module imports matplotlib) is never imported when serving.
    """
    from hyperpyyaml import resolve_references

    served = resolve_references(text, {key: None for key in TRAINING_ONLY_ENTRIES}, overrides_must_match=False)
    return named_objects(served.getvalue())


def unresolved_names(text: str, names: list[str] | None = None) -> dict[str, str]:
    """Those of ``names`` (default: all :func:`named_objects`) that do not import here, each with why.

    What HyperPyYAML needs to load the config, without building anything (no weights, no Qwen2 dir);
    call ``prepare_imports`` first.
    """
    missing: dict[str, str] = {}
    for name in named_objects(text) if names is None else names:
        try:
            if pydoc.locate(name) is None:
                missing[name] = "no such name"
        except pydoc.ErrorDuringImport as exc:
            missing[name] = f"importing {exc.filename} failed: {exc.exc.__name__}: {exc.value}"
    return missing


def _cosyvoice_dir() -> str:
    try:
        spec = importlib.util.find_spec("cosyvoice")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return "not installed"
    return str(Path(next(iter(spec.submodule_search_locations))).parent)
