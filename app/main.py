"""``create_app(settings)``: the FastAPI application factory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from app.api import compat, health, metrics, openai, openapi, tts, voices, ws_speech
from app.api.admission import AdmissionMiddleware
from app.api.errors import install_error_handlers
from app.api.routes import ENDPOINTS
from app.config import Settings
from app.lifespan import lifespan
from app.metrics import Metrics
from app.middleware import RequestContextMiddleware
from app.runtime import Runtime
from app.voices import VoiceLibrary


def create_app(settings: Settings | None = None, engine_factory: Callable[[int], Any] | None = None) -> FastAPI:
    """Build the app. ``engine_factory`` overrides the engines built from settings (tests)."""
    settings = settings or Settings()
    runtime = Runtime(settings=settings,
                      voices=VoiceLibrary(settings.voices.dir, max_voices=settings.voices.max_voices))
    if settings.metrics.enabled:
        runtime.metrics = Metrics(stats=lambda: runtime.pool.stats() if runtime.pool is not None else None,
                                  routes=ENDPOINTS)
    app = FastAPI(title="cosyserve", version="0.1.0", lifespan=lifespan,
                  description="A production inference server for CosyVoice text-to-speech.")
    app.state.runtime = runtime
    app.state.engine_factory = engine_factory
    for module in (health, tts, openai, compat, voices, ws_speech):
        app.include_router(module.router)
    if runtime.metrics is not None:
        app.include_router(metrics.router)
    install_error_handlers(app)
    openapi.install(app)
    app.add_middleware(AdmissionMiddleware, pool=lambda: runtime.pool)  # inner: runs after the request id is set
    app.add_middleware(RequestContextMiddleware, access_log=settings.server.access_log,
                       on_done=runtime.metrics.on_done if runtime.metrics is not None else None)
    return app
