"""Compatibility shims between CosyVoice distributions and this server.

Everything here exists because of a defect or a process-wide hazard in a
CosyVoice distribution, and is confined to this module so the adapter stays
clean. An upstream checkout needs only the process-wide parts (mel cache).

* ``prepare_imports``: matcha's ``matcha/utils/__init__.py`` imports training-only
  packages (lightning, hydra, rich, ...). Inference needs only
  ``matcha.utils.audio``; when those packages are missing we register
  ``matcha.utils`` as a bare package so its submodules import without them.
  ``matcha.utils.pylogger`` imports lightning just for a logger: stubbed likewise.
* ``stand_in_training_modules`` (called by ``prepare_imports``): a released model dir's yaml is
  upstream's training config, data pipeline included; it names
  ``cosyvoice.dataset.processor.*``, and HyperPyYAML imports that module while loading. The
  module imports training-only packages at the top (``pyarrow``, ``pyworld``; upstream's also
  ``cosyvoice.utils.onnx``), which inference never uses and the default install leaves out.
  When the real module does not import, a :class:`TrainingOnlyModule` takes its place: every
  name resolves, and calling one raises :class:`TrainingOnlyError`. A module that imports
  (the training packages installed) is used as it is.
* ``_patch_qwen2_incremental_mask``: with transformers 5 CosyVoice2's cached LLM step
  would attend to one position only (see the function).
* ``add_source_path``: put a user's upstream checkout (and its bundled
  Matcha-TTS) first on ``sys.path``.
* ``attach_llm``: PyPI ``cosyvoice-minicpmo`` never assigns ``llm`` in
  ``CosyVoice2Model.__init__`` and never loads ``llm.pt``; we build and load it
  ourselves in every case, then make sure the model object holds it.
* ``SafeMelExtractor``: matcha's ``mel_spectrogram`` caches its window and mel
  basis keyed only by fmax and device, so a v1 and a v2 model in one process
  corrupt each other's features. We serialise calls and reset the cache when
  the parameters change.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
import threading
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, NoReturn

from app.engines.cosyvoice.quiet import silence_third_party_warnings

log = logging.getLogger("cosyserve.engine")

# CosyVoice modules a released yaml names only for training (its data pipeline).
TRAINING_ONLY_MODULES = ("cosyvoice.dataset.processor",)

_imports_lock = threading.Lock()
_imports_ready = False


def add_source_path(cosyvoice_path: str | os.PathLike | None) -> None:
    """Prefer a user's upstream CosyVoice checkout over any installed copy."""
    if not cosyvoice_path:
        return
    root = Path(cosyvoice_path).expanduser().resolve()
    if not (root / "cosyvoice").is_dir():
        raise FileNotFoundError(f"engine.cosyvoice_path={root} does not contain a 'cosyvoice' package")
    for p in (root / "third_party" / "Matcha-TTS", root):
        if p.is_dir() and str(p) not in sys.path:
            sys.path.insert(0, str(p))


def prepare_imports(cosyvoice_path: str | os.PathLike | None = None) -> None:
    """Make ``cosyvoice`` and ``matcha`` importable for inference (idempotent)."""
    global _imports_ready
    with _imports_lock:
        if _imports_ready:
            return
        silence_third_party_warnings()
        add_source_path(cosyvoice_path)
        try:
            importlib.import_module("matcha.utils")
        except ImportError as exc:
            spec = importlib.util.find_spec("matcha")
            if spec is None or not spec.submodule_search_locations:
                raise ImportError("CosyVoice's 'matcha' package is not installed; run `make setup`") from exc
            sys.modules.pop("matcha.utils", None)
            pkg = types.ModuleType("matcha.utils")
            pkg.__path__ = [str(Path(list(spec.submodule_search_locations)[0]) / "utils")]
            pkg.__package__ = "matcha.utils"
            sys.modules["matcha.utils"] = pkg
            importlib.import_module("matcha").utils = pkg  # so pydoc.locate (hyperpyyaml) finds it
            log.debug("matcha.utils registered without its training-only imports (%s)", exc)
        try:
            importlib.import_module("matcha.utils.pylogger")
        except ImportError:  # it imports lightning only for rank_zero_only; inference needs a logger
            stub = types.ModuleType("matcha.utils.pylogger")
            stub.get_pylogger = logging.getLogger  # type: ignore[attr-defined]
            sys.modules["matcha.utils.pylogger"] = stub
            sys.modules["matcha.utils"].pylogger = stub
        stand_in_training_modules()
        _patch_qwen2_incremental_mask()
        _imports_ready = True


class TrainingOnlyError(RuntimeError):
    """A training-only stand-in (:class:`TrainingOnlyModule`) was called."""


class TrainingOnlyModule(types.ModuleType):
    """Stands in for a CosyVoice module that only training uses and that does not import here.

    Every public name resolves to a function, so HyperPyYAML's ``!name:`` accepts it with or
    without arguments (it wraps them in a ``functools.partial``); calling it raises
    :class:`TrainingOnlyError` saying why. Names starting with ``_`` do not resolve (import
    machinery and introspection probe those).
    """

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(name, f"cosyserve's training-only stand-in for {name} ({reason})")
        self._reason = reason

    def __getattr__(self, attr: str) -> Callable[..., NoReturn]:
        if attr.startswith("_"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        fn = _training_only(self.__name__, attr, self._reason)
        setattr(self, attr, fn)
        return fn


def _training_only(module: str, attr: str, reason: str) -> Callable[..., NoReturn]:
    def training_only(*args: Any, **kwargs: Any) -> NoReturn:
        raise TrainingOnlyError(
            f"{module}.{attr} is part of CosyVoice's training data pipeline, which inference never runs; "
            f"{module} is a stand-in here because the real module does not import ({reason}). "
            "To train, install CosyVoice's training requirements (pyarrow, pyworld)."
        )

    training_only.__name__ = training_only.__qualname__ = attr
    training_only.__module__ = module
    return training_only


def stand_in_training_modules(names: Iterable[str] = TRAINING_ONLY_MODULES) -> list[str]:
    """Import each module of ``names``; where that fails with an ImportError, register a stand-in.

    Only a module that exists gets one: if its package is missing (or the distribution has no
    such file), nothing is registered and a yaml naming it fails to load as any unknown name
    does. Returns the names that got a stand-in now.
    """
    installed = []
    for name in names:
        if name in sys.modules:  # the real one, or our stand-in from an earlier call
            continue
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except (ImportError, ValueError):  # its package does not exist (or is no package)
            continue
        try:
            importlib.import_module(name)
            continue
        except ImportError as exc:
            reason = f"{type(exc).__name__}: {exc}"
        parent, _, child = name.rpartition(".")
        module = TrainingOnlyModule(name, reason)
        sys.modules[name] = module
        setattr(sys.modules[parent], child, module)  # so pydoc.locate (hyperpyyaml) walks to it
        installed.append(name)
        log.info("%s does not import (%s): the yaml's training data pipeline resolves to stand-ins "
                 "that refuse to run (inference does not use it)", name, reason)
    return installed


def _patch_qwen2_incremental_mask() -> None:
    """transformers >= 5: make CosyVoice2's cached decoding step see its context again.

    ``Qwen2Encoder.forward_one_step`` passes the last row of its causal mask as the
    attention mask: one column per step, while the cache holds the whole prefix.
    transformers 4.x ignored such a short mask; 5.x pads it with False, so every
    cached step attends to the first position only and the LLM decodes blind (real
    weights included). For batch size 1 without padding the mask carries no
    information, so we drop it and let the model apply its causal mask.
    """
    try:
        import transformers

        from cosyvoice.llm.llm import Qwen2Encoder
    except ImportError:
        return
    if int(transformers.__version__.split(".")[0]) < 5 or getattr(Qwen2Encoder, "_cosyserve_patched", False):
        return

    # later transformers 5 releases (5.24 here) renamed the argument and output past_key_values -> cache;
    # the old name still works but warns. Earlier 5.x know only past_key_values.
    cache_name = "cache" if "cache" in inspect.signature(transformers.Qwen2ForCausalLM.forward).parameters \
        else "past_key_values"

    def forward_one_step(self: Any, xs: Any, masks: Any, cache: Any = None) -> tuple[Any, Any]:
        outs = self.model(inputs_embeds=xs, output_hidden_states=True, return_dict=True, use_cache=True,
                          **{cache_name: cache})
        return outs.hidden_states[-1], outs[cache_name]

    Qwen2Encoder.forward_one_step = forward_one_step
    Qwen2Encoder._cosyserve_patched = True


_mel_lock = threading.Lock()
_mel_last_key: tuple | None = None


class SafeMelExtractor:
    """Wraps a CosyVoice ``feat_extractor`` so that models of different families can share a process."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        kw = getattr(fn, "keywords", {}) or {}
        self.key = tuple(sorted((k, repr(v)) for k, v in kw.items()))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        global _mel_last_key
        with _mel_lock:
            if _mel_last_key != self.key:
                audio = sys.modules.get("matcha.utils.audio")
                if audio is not None:
                    for name in ("mel_basis", "hann_window"):
                        cache = getattr(audio, name, None)
                        if isinstance(cache, dict):
                            cache.clear()
                _mel_last_key = self.key
            return self.fn(*args, **kwargs)


def attach_llm(model: Any, llm: Any) -> None:
    """Ensure ``model.llm`` is the loaded LLM (minicpmo's CosyVoice2Model never sets it)."""
    if getattr(model, "llm", None) is not llm:
        model.llm = llm
