"""Runtime configs for tests, built by the server's own conversion (app/settings/runtime.py).

Each helper takes the runtime config's field names: those that are settings go through the
settings (validated there, as for the server); the few that are not (a byte count where the
setting is in MB, a close timeout, the limiter's tuning) are put in after. The values tests
start from unless they ask (``runtime.BARE_ENGINE``, a fixed admission of 2 + 8, a limiter whose
waiting room no queue timeout bounds) are the tests' choice, named here, not the server's defaults.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from app.engines.cosyvoice.config import CosyVoiceConfig
from app.engines.cosyvoice.levers import Levers
from app.serving.admission.limit.adaptive import AdaptiveConfig
from app.serving.bounds import SpeechLimits
from app.serving.config import PoolConfig
from app.serving.session import SessionLimits
from app.settings import Settings, runtime

FAKE = {"fake_engine": True}  # no model dir is resolved for configs that need none
POOL_BASE = {"workers": 2, "max_queue": 8, "admission": "fixed"}


def _split(kw: dict[str, Any], later: tuple[str, ...]) -> dict[str, Any]:
    return {name: kw.pop(name) for name in later if name in kw}


def engine(model_dir: str | Path, **kw: Any) -> CosyVoiceConfig:
    later = _split(kw, ("max_segment_chars", "max_segment_tokens"))
    return replace(runtime.engine_config_of(str(model_dir), **kw), **later)


def pool(**kw: Any) -> PoolConfig:
    later = _split(kw, ("stream_buffer_bytes", "stream_buffer_total_bytes", "close_timeout_s"))
    return replace(runtime.pool_config_of(**{**POOL_BASE, **kw}), **later)


def adaptive(ceiling: int, initial: float, budget_s: float | None = None, tolerance: float = 2.5,
             max_wait_s: float | None = None, **tuning: Any) -> AdaptiveConfig:
    settings = Settings(pool={"workers": ceiling, "max_queue": 0, "admission": "adaptive",
                              "admission_budget_s": budget_s, "admission_tolerance": tolerance}, dev=FAKE)
    return replace(runtime.adaptive_config(settings), initial=initial, max_wait_s=max_wait_s, **tuning)


def levers(threads: int = 1, **kw: Any) -> Levers:
    base = {k: runtime.BARE_ENGINE[k] for k in ("flow_runtime", "onnx_cache_dir")}
    return runtime.levers(Settings(engine={**base, **kw, "torch_threads": threads}, dev=FAKE))


def speech_limits(**kw: Any) -> SpeechLimits:
    later = _split(kw, ("max_upload_bytes",))
    return replace(runtime.speech_limits(Settings(server=kw, dev=FAKE)), **later)


def session_limits(max_utterance_chars: int | None = None, **kw: Any) -> SessionLimits:
    server = {"max_text_chars": max_utterance_chars} if max_utterance_chars is not None else {}
    return runtime.session_limits(Settings(websocket=kw, server=server, dev=FAKE))
