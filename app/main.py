"""``create_app(settings)``: the FastAPI application factory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from app.api import (
    health,
    openai,
    openapi,
    playground,
    tts,
    upstream,
    voices,
    ws_speech,
)
from app.api import metrics as metrics_api
from app.api.admission import AdmissionMiddleware
from app.api.auth import APIKeyMiddleware, document_keys
from app.api.bodies import BodyGate, BodyLimits
from app.api.errors import install_error_handlers
from app.api.refusals import RefusalPacer
from app.api.respond import install_quiet_cut
from app.api.routes import ENDPOINTS
from app.lifespan import lifespan
from app.metrics import Metrics
from app.metrics.cache import CacheCollector
from app.metrics.edge import EdgeCollector
from app.metrics.heap import HeapCollector
from app.middleware import RequestContextMiddleware
from app.runtime import Boot, running
from app.serving.answers import AnswerCache
from app.serving.pool import EnginePool
from app.settings import Settings


def create_app(settings: Settings | None = None, engine_factory: Callable[[int], Any] | None = None) -> FastAPI:
    """Build the app. ``engine_factory`` overrides the engines built from settings (tests)."""
    settings = settings or Settings()
    app = FastAPI(title="cosyserve", version="0.1.0", lifespan=lifespan,
                  description="A production inference server for CosyVoice text-to-speech.")

    def pool() -> EnginePool | None:  # for the edge and the scrape: None until the lifespan built it
        runtime = running(app)
        return runtime.pool if runtime is not None else None

    def answers() -> AnswerCache | None:  # the answer cache, likewise
        runtime = running(app)
        return runtime.answers if runtime is not None else None

    metrics = Metrics(stats=lambda: p.stats() if (p := pool()) is not None else None,
                      routes=ENDPOINTS) if settings.metrics.enabled else None
    app.state.boot = Boot(settings=settings, metrics=metrics, engine_factory=engine_factory)
    bodies, pacer = BodyGate(body_limits(settings)), RefusalPacer(settings.server.refusals_per_s)
    install_quiet_cut()  # a stream cut on purpose (a client that reads nothing) is not an application error
    if metrics is not None:
        metrics.registry.register(EdgeCollector(bodies, pacer, lambda: (p.stats().get("stream_buffers")
                                                                         if (p := pool()) is not None else None)))
        metrics.registry.register(CacheCollector(lambda: a.stats() if (a := answers()) is not None else None))
        metrics.registry.register(HeapCollector(lambda: r.trimmer.stats if (r := running(app)) is not None else None))
    for module in (health, tts, openai, upstream, voices, ws_speech, playground):
        app.include_router(module.router)
    playground.mount(app)
    if metrics is not None:
        app.include_router(metrics_api.router)
    install_error_handlers(app)
    openapi.install(app)
    if settings.server.keys:
        document_keys(app, metrics_open=not settings.metrics.require_key)
    # Outermost last: CORS (so its headers reach 401s and 503s too) -> request id + access log
    # -> API keys (before admission: a request without a key takes no permit) -> admission.
    app.add_middleware(AdmissionMiddleware, pool=pool, bodies=bodies, pacer=pacer, cache=answers)
    app.add_middleware(APIKeyMiddleware, keys=settings.server.keys, metrics_open=not settings.metrics.require_key,
                       on_refused=metrics.on_unauthorized if metrics is not None else None,
                       priorities=settings.server.key_priorities)
    app.add_middleware(RequestContextMiddleware, access_log=settings.server.access_log,
                       on_done=metrics.on_done if metrics is not None else None)
    if settings.server.cors_origins:
        app.add_middleware(CORSMiddleware, **cors_options(settings.server.cors_origins))
    return app


# A form's text fields and boundaries, on top of its uploaded audio (server.max_upload_mb).
FORM_ALLOWANCE_BYTES = 1 << 20


# A body without uploaded audio (JSON, a urlencoded form): its text may take this many bytes a character
# (a \uXXXX escape), plus this much for every other field. 4096 characters: 96 KB.
PLAIN_BYTES_PER_CHAR = 8
PLAIN_ALLOWANCE_BYTES = 64 * 1024


def body_limits(settings: Settings) -> BodyLimits:
    s = settings.server
    plain = s.max_text_chars * PLAIN_BYTES_PER_CHAR + PLAIN_ALLOWANCE_BYTES
    return BodyLimits(max_bytes=int(s.max_upload_mb * 1024 * 1024) + FORM_ALLOWANCE_BYTES, timeout_s=s.body_timeout_s,
                      max_plain_bytes=plain, max_reads=s.max_body_reads, wait_s=s.body_read_wait_s,
                      max_buffered_bytes=int(s.body_buffer_mb * 1024 * 1024))


def cors_options(origins: list[str]) -> dict[str, Any]:
    """Browsers on ``origins`` may call the API with a key; they can read our headers and errors."""
    return {
        "allow_origins": origins,
        "allow_methods": ["GET", "POST", "DELETE", "OPTIONS"],
        "allow_headers": ["Authorization", "X-API-Key", "Content-Type", "X-Request-ID"],
        "expose_headers": ["X-Request-ID", "X-Sample-Rate", "Retry-After", "WWW-Authenticate", "Location"],
        "allow_credentials": False,  # keys travel in headers, never in cookies
        "max_age": 600,
    }
