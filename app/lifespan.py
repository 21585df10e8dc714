"""Composition root: build engines, load and warm them, yield the runtime, drain, close.

The only place (with ``engine_factory``) that knows concrete engine classes. The
runtime it yields is whole: the pool loaded, the speech service and the started
voice library in place (``app/runtime.py``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from fastapi import FastAPI

from app import gcpolicy
from app.engines import threads
from app.heap import HeapTrimmer
from app.runtime import Boot, EngineFactory, Runtime
from app.serving.pool import EnginePool
from app.serving.speech import SpeechService
from app.settings import Settings
from app.settings.runtime import (
    answer_cache,
    engine_config,
    pool_config,
    session_limits,
    speech_limits,
    wyoming_config,
)
from app.voices.library import VoiceLibrary
from app.wyoming.server import WyomingServer

log = logging.getLogger("cosyserve")

# Adaptive admission on a CPU starts at this many requests in flight per core (then follows latency).
CPU_START_PER_CORE = 1


def resolve_model_dir(settings: Settings) -> str:
    """The configured model dir, or the embedded tiny default (built once into the cache)."""
    if settings.engine.model_dir:
        return str(Path(settings.engine.model_dir).expanduser().resolve())
    from app.devmodels.tiny import ensure_tiny_model

    dev = settings.dev
    path = ensure_tiny_model(dev.tiny_cache_dir, dev.tiny_version, cosyvoice_path=settings.engine.cosyvoice_path)
    log.warning(
        "no engine.model_dir configured: serving the embedded TINY RANDOM-WEIGHT CosyVoice%d test model at %s. "
        "It produces noise, not speech. Point engine.model_dir (env COSYSERVE_ENGINE__MODEL_DIR) at real "
        "CosyVoice weights, e.g. a downloaded CosyVoice2-0.5B dir.",
        dev.tiny_version, path,
    )
    return str(path)


def engine_factory(settings: Settings, llm_observer: Any = None) -> EngineFactory:
    """Build the factory that creates one engine per slot (not loaded yet)."""
    eng = settings.engine
    if settings.dev.fake_engine:
        from app.engines.fake import FakeBehaviour, FakeEngine

        delay = settings.dev.fake_chunk_delay_s  # sleeping, not computing: a latency-bound engine for cluster tests
        behaviour = FakeBehaviour(first_chunk_delay_s=delay, chunk_delay_s=delay)
        return lambda index: FakeEngine(behaviour, name=eng.name or "fake")
    from app.engines.cosyvoice.device import resolve_device
    from app.engines.cosyvoice.engine import CosyVoiceEngine

    resolve_device(eng.device)  # engine.device: cuda without a usable GPU fails now, before any model work
    cfg = engine_config(settings, resolve_model_dir(settings))
    return lambda index: CosyVoiceEngine(cfg, name=eng.name, llm_observer=llm_observer)


def admission_start(settings: Settings, device: str, ceiling: int) -> tuple[int, str]:
    """Where the adaptive limit starts, and why (one line for the startup log).

    A pool sized by hand (``workers`` or ``max_queue`` set) starts at its ceiling. Else, on an
    accelerator requests overlap up to the batch: start at the ceiling (the batch size). On a CPU
    flow + HiFT are compute-bound, about one call per core: start at ``CPU_START_PER_CORE``
    requests per core (cores / torch_threads). Measured latency moves it from there.
    """
    if not settings.pool.auto_sized:
        return ceiling, "pool sized by hand: start at its ceiling"
    if device != "cpu":
        return ceiling, f"{device}: requests overlap up to the batch, start at the ceiling"
    cores = max(1, (os.cpu_count() or 1) // settings.engine.torch_threads)
    start = min(ceiling, CPU_START_PER_CORE * cores)
    return start, (f"CPU: {cores} core(s) for torch_threads {settings.engine.torch_threads}, "
                   f"start at {CPU_START_PER_CORE} per core")


def log_admission(settings: Settings, pool: EnginePool) -> None:
    """Pick the adaptive limit's start from the loaded engine's device, and say what was chosen and why."""
    p, adm = settings.pool, pool.gate.admission
    if adm.mode == "fixed":
        log.info("admission: fixed, %d request(s) at once (pool.workers %d + pool.max_queue %d; "
                 "pool.admission: adaptive makes it follow measured latency)", adm.capacity, p.workers, p.queue_limit)
        return
    start, why = admission_start(settings, pool.info.device, adm.capacity)
    pool.gate.start_at(start)
    budget = (f"budget {p.admission_budget_s:g} s" if p.admission_budget_s is not None
              else f"budget {p.admission_tolerance:g}x the unloaded latency")
    log.info("admission: adaptive, limit starts at %d and follows measured latency (%s) within 1..%d "
             "(pool.workers %d + pool.max_queue %d); %s", adm.limit, budget, adm.capacity, p.workers,
             p.queue_limit, why)


async def start_wyoming(runtime: Runtime) -> WyomingServer | None:
    """The Wyoming TTS service when ``wyoming.port`` is set (else None); a failed start closes the runtime."""
    config = wyoming_config(runtime.settings)
    if config is None:
        return None
    server = WyomingServer(runtime, config)
    try:
        await server.start()
    except BaseException:  # e.g. the port is taken: do not leak the loaded slots
        await runtime.voices.close()
        await runtime.pool.close()
        if runtime.answers is not None:
            await runtime.answers.close()
        raise
    return server


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict]:
    boot: Boot = app.state.boot
    settings, metrics = boot.settings, boot.metrics
    factory = boot.engine_factory
    batching = factory is None and settings.engine.batching  # an injected factory (tests) is not shared
    threads.set_offset(settings.pool.compute_nice)  # before any compute thread starts
    if threads.offset() and threads.supported():
        log.info("compute threads run at nice +%d below the event loop (pool.compute_nice)", threads.offset())
    with gcpolicy.paused():  # loading allocates in bulk and frees next to nothing (app/gcpolicy.py)
        if factory is None:
            llm_observer = metrics.llm_observer() if metrics is not None else None
            factory = await anyio.to_thread.run_sync(engine_factory, settings, llm_observer)
            if metrics is not None and not settings.dev.fake_engine:
                from app.engines.cosyvoice.device import cuda_memory

                metrics.watch_gpu_memory(cuda_memory)  # no series on a CPU server
        observer = metrics.pool_observer() if metrics is not None else None
        pool = EnginePool(factory, pool_config(settings, batching), observer=observer)
        log.info("loading %d engine slot(s)...", settings.pool.workers)
        await pool.start()
        frozen = gcpolicy.freeze_loaded()  # one full pass over what loading left (not gen 0 over all of it)
    log.info("gc: %d objects of the loaded model frozen (full collections skip them)", frozen)
    log_admission(settings, pool)
    v = settings.voices
    voices = VoiceLibrary(v.dir, max_voices=v.max_voices, sync_interval_s=v.sync_interval_s)
    try:
        await voices.start(pool)
        answers = answer_cache(settings, pool.info) if settings.cache.enabled else None
    except BaseException:  # e.g. the voices or cache dir cannot be created: do not leak the loaded slots
        await pool.close()
        raise
    runtime = Runtime(settings=settings, pool=pool, speech=SpeechService(pool, speech_limits(settings), library=voices),
                      voices=voices, session_limits=session_limits(settings), model_created=int(time.time()),
                      metrics=metrics, answers=answers, trimmer=HeapTrimmer(settings.server.heap_trim_interval_s))
    wyoming = await start_wyoming(runtime)
    runtime.trimmer.start()  # malloc's free pages back to the kernel every server.heap_trim_interval_s
    app.state.runtime = runtime
    info = pool.info
    log.info("ready: model %s (%s, %d Hz, %s), %d worker(s), queue %d", info.name, info.family, info.sample_rate,
             info.device, settings.pool.workers, settings.pool.queue_limit)
    try:
        yield {"runtime": runtime}
    finally:
        runtime.draining = True
        if wyoming is not None:
            wyoming.stop_listening()
        await voices.close()
        await pool.begin_drain()
        if len(runtime.sessions):  # not drained by the server (e.g. a TestClient): close them now
            await runtime.sessions.drain(0)
        if wyoming is not None:
            await wyoming.close()
        if not await pool.wait_idle(settings.server.drain_timeout_s):
            log.warning("drain timeout (%.0fs) reached with work in flight; cancelling it", settings.server.drain_timeout_s)
        await pool.close()
        await runtime.trimmer.stop()
        if answers is not None:
            await answers.close()  # the directory writes still running
        gcpolicy.thaw()
        log.info("engine pool closed")
