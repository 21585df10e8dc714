"""``create_app(settings)``: the FastAPI application factory."""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI

from app.api import compat, health, metrics, openai, tts, voices
from app.api.errors import install_error_handlers
from app.config import Settings
from app.lifespan import lifespan
from app.middleware import RequestContextMiddleware
from app.runtime import Runtime


def create_app(settings: Settings | None = None, engine_factory: Callable[[int], Any] | None = None) -> FastAPI:
    """Build the app. ``engine_factory`` overrides the engines built from settings (tests)."""
    settings = settings or Settings()
    runtime = Runtime(settings=settings)
    app = FastAPI(title="cosyserve", version="0.1.0", lifespan=lifespan,
                  description="A production inference server for CosyVoice text-to-speech.")
    app.state.runtime = runtime
    app.state.engine_factory = engine_factory
    for module in (health, tts, openai, compat, voices, metrics):
        app.include_router(module.router)
    install_error_handlers(app)
    app.add_middleware(RequestContextMiddleware, access_log=settings.server.access_log)
    return app
