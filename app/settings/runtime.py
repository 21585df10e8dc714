"""The one conversion from settings to the runtime configs the layers below are built with.

``PoolConfig``, ``AdaptiveConfig``, ``CosyVoiceConfig`` (with its ``Levers``), ``SessionLimits``
and ``SpeechLimits`` have no defaults or checks of their own: every value comes from here,
where it is the setting's (validated in sections.py) or a named constant. Tests build them
through these functions too (tests/support/configs.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from app.engines.base import EngineInfo
from app.engines.cosyvoice.config import (
    MAX_SEGMENT_CHARS,
    MAX_SEGMENT_TOKENS,
    CosyVoiceConfig,
)
from app.engines.cosyvoice.levers import Levers
from app.serving.admission.classes import Priority
from app.serving.admission.limit.adaptive import (
    LATENCY_WEIGHT,
    LEVEL_SAMPLES,
    PAIR_S,
    AdaptiveConfig,
)
from app.serving.answers import AnswerCache, CacheConfig
from app.serving.bounds import SpeechLimits
from app.serving.config import PoolConfig
from app.serving.session import SessionLimits
from app.settings.load import Settings
from app.settings.sections import EngineSettings
from app.wyoming.config import WyomingConfig

MB = 1024 * 1024
STREAM_BUFFER_CHUNKS = 1 << 16  # a stream's buffered items when pool.stream_buffer_chunks is unset (bytes bound it)
CLOSE_TIMEOUT_S = 30.0  # closing the pool waits this long for slot threads to return
# An engine built without a server (benchmarks, tests) starts from this, not from the server's defaults:
# one request per instance, the torch flow, fp32, no flow or prompt cache, ONNX graphs in memory. A caller asks
# for more.
BARE_ENGINE = {"batching": False, "flow_runtime": "torch", "dtype": "fp32", "flow_prompt_cache_mb": 0,
               "flow_cache": False, "onnx_cache_dir": None}


def server_engine(**over: Any) -> dict[str, Any]:
    """``engine.*`` settings that put back what a server starts with where ``BARE_ENGINE`` differs (the batching
    and the ONNX cache dir stay the caller's), then ``over``: for benchmarks that measure the defaults."""
    defaults = EngineSettings()
    return {**{k: getattr(defaults, k) for k in BARE_ENGINE if k not in ("batching", "onnx_cache_dir")}, **over}


def pool_config(settings: Settings, batching: bool = False) -> PoolConfig:
    """With batching every slot is a handle onto one shared instance (and its LLM scheduler)."""
    p = settings.pool
    assert p.workers is not None  # resolved by Settings
    return PoolConfig(
        workers=p.workers, max_queue=p.queue_limit, queue_timeout_s=p.queue_timeout_s,
        request_timeout_s=p.request_timeout_s, share_engine=p.share_engine or batching,
        stream_buffer_chunks=p.stream_buffer_chunks or STREAM_BUFFER_CHUNKS,
        stream_buffer_bytes=round(p.stream_buffer_mb * MB), stream_buffer_total_bytes=round(p.stream_buffer_total_mb * MB),
        health_timeout_s=p.health_timeout_s, stuck_grace_s=p.stuck_grace_s, close_timeout_s=CLOSE_TIMEOUT_S,
        adaptive=adaptive_config(settings) if p.admission == "adaptive" else None,
        bulk_max_queue=p.bulk_max_queue, bulk_queue_timeout_s=p.bulk_queue_timeout_s)


def adaptive_config(settings: Settings) -> AdaptiveConfig:
    """The adaptive limit within ``workers + max_queue``; it starts there (the lifespan moves it for the machine)."""
    p = settings.pool
    assert p.workers is not None
    ceiling = p.workers + p.queue_limit
    return AdaptiveConfig(ceiling=ceiling, initial=ceiling, budget_s=p.admission_budget_s,
                          tolerance=p.admission_tolerance, max_wait_s=p.queue_timeout_s,
                          level_samples=LEVEL_SAMPLES, latency_weight=LATENCY_WEIGHT, pair_s=PAIR_S)


def levers(settings: Settings) -> Levers:
    e = settings.engine
    return Levers(llm_quantization=e.llm_quantization, flow_runtime=e.flow_runtime, flow_steps=e.flow_steps,
                  flow_cfg=e.flow_cfg, onnx_cache_dir=e.onnx_cache_dir, threads=e.torch_threads)


def engine_config(settings: Settings, model_dir: str) -> CosyVoiceConfig:
    """One CosyVoice engine's config (``engine.batching`` is already resolved: on only for a v2/v3 dir)."""
    e = settings.engine
    return CosyVoiceConfig(
        model_dir=model_dir, cosyvoice_path=e.cosyvoice_path, device=e.device, dtype=e.dtype,
        dtype_stages=tuple(e.dtype_stages), llm_weights=e.llm_weights, torch_threads=e.torch_threads,
        prompt_cache_size=e.prompt_cache_size, max_segment_chars=MAX_SEGMENT_CHARS,
        max_segment_tokens=MAX_SEGMENT_TOKENS, text_normalization=e.text_normalization, batching=e.batching,
        max_batch_size=e.max_batch_size, llm_greedy=settings.dev.llm_greedy, token2wav_workers=e.token2wav_workers,
        flow_cache=e.flow_cache, flow_cache_precision=e.flow_cache_precision,
        flow_cache_window_frames=e.flow_cache_window_frames,
        flow_prompt_cache_mb=e.flow_prompt_cache_mb, flow_cache_budget_mb=e.flow_cache_budget_mb,
        levers=levers(settings), token2wav_batch=e.token2wav_batch, token2wav_max_batch=e.token2wav_max_batch,
        prefill_batch=e.prefill_batch)


def session_limits(settings: Settings) -> SessionLimits:
    w = settings.websocket
    return SessionLimits(idle_timeout_s=w.idle_timeout_s, max_session_chars=w.max_session_chars,
                         max_utterance_chars=settings.server.max_text_chars, max_sessions=w.max_sessions,
                         max_session_s=w.max_session_s, max_message_bytes=w.max_message_bytes)


def cache_config(settings: Settings) -> CacheConfig:
    c = settings.cache
    return CacheConfig(enabled=c.enabled, memory_bytes=round(c.memory_mb * MB), disk_dir=c.dir,
                       disk_bytes=round(c.disk_mb * MB), max_entry_bytes=round(c.max_entry_mb * MB),
                       derive_seed=c.derive_seed, per_key=not c.shared_between_keys)


# Engine settings that name where things are, not what is computed: replicas that mount one model at
# different paths share answers.
_PLACES = frozenset({"model_dir", "cosyvoice_path", "onnx_cache_dir", "name"})


def model_fingerprint(settings: Settings, info: EngineInfo) -> str:
    """What fixes an answer's bytes besides the request: the loaded model (its files' fingerprint, family,
    device) and every engine setting that may change the numbers (precision, runtimes, steps, batching...)."""
    engine = {k: v for k, v in settings.engine.model_dump(mode="json").items() if k not in _PLACES}
    dev = settings.dev
    what = {"info": {k: v for k, v in dataclasses.asdict(info).items() if k != "name"}, "engine": engine,
            "dev": {"fake_engine": dev.fake_engine, "llm_greedy": dev.llm_greedy}}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def answer_cache(settings: Settings, info: EngineInfo) -> AnswerCache:
    return AnswerCache(cache_config(settings), model_fingerprint(settings, info))
def wyoming_config(settings: Settings) -> WyomingConfig | None:
    """The Wyoming service's config; None when ``wyoming.port`` is unset (no service)."""
    w = settings.wyoming
    if w.port is None:
        return None
    limits = dataclasses.replace(session_limits(settings), max_sessions=w.max_sessions, max_message_bytes=w.max_event_bytes)
    return WyomingConfig(host=w.host or settings.server.host, port=w.port, limits=limits,
                         priority=Priority(w.priority), samples_per_chunk=w.samples_per_chunk,
                         max_event_bytes=w.max_event_bytes)


def speech_limits(settings: Settings) -> SpeechLimits:
    s = settings.server
    return SpeechLimits(max_text_chars=s.max_text_chars, max_upload_bytes=round(s.max_upload_mb * MB),
                        body_timeout_s=s.body_timeout_s)


def engine_config_of(model_dir: str, **engine: Any) -> CosyVoiceConfig:
    """An engine's config from ``engine.*`` settings given by name (``llm_greedy`` from ``dev``) over
    ``BARE_ENGINE``, the rest their defaults: for benchmarks and tests that build an engine without a server."""
    dev = {name: engine.pop(name) for name in ("llm_greedy",) if name in engine}
    engine = {**BARE_ENGINE, **engine, "model_dir": model_dir}
    return engine_config(Settings(engine=engine, dev=dev), model_dir)


def pool_config_of(batching: bool = False, **pool: Any) -> PoolConfig:
    """A pool's config from ``pool.*`` settings given by name, the rest their defaults (benchmarks, tests)."""
    return pool_config(Settings(pool=pool, dev={"fake_engine": True}), batching)
