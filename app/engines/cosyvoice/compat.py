"""Compatibility shims between CosyVoice distributions and this server.

Everything here exists because of a defect or a process-wide hazard in a
CosyVoice distribution, and is confined to this module so the adapter stays
clean. An upstream checkout needs only the process-wide parts (mel cache).

* ``prepare_imports``: matcha's ``matcha/utils/__init__.py`` imports training-only
  packages (lightning, hydra, rich, ...). Inference needs only
  ``matcha.utils.audio``; when those packages are missing we register
  ``matcha.utils`` as a bare package so its submodules import without them.
  ``matcha.utils.pylogger`` imports lightning just for a logger: stubbed likewise.
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
from pathlib import Path
from typing import Any, Callable

from app.engines.cosyvoice.quiet import silence_third_party_warnings

log = logging.getLogger("cosyserve.engine")

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
        _patch_qwen2_incremental_mask()
        _imports_ready = True


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
