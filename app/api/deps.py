"""Typed dependencies: routers get the runtime's services from lifespan state, never globals.

The lifespan yields a whole ``Runtime`` (``app/runtime.py``): every service in it
exists, so nothing here checks for a missing one. A handler gets its request's
``RequestContext`` here too (``ContextDep``), once, and hands it to what it calls.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from app.api.context import RequestContext, context_of
from app.runtime import Runtime
from app.serving.pool import EnginePool
from app.serving.speech import SpeechService
from app.voices.library import VoiceLibrary


def get_runtime(request: Request) -> Runtime:
    return request.state.runtime


def get_pool(request: Request) -> EnginePool:
    return get_runtime(request).pool


def get_speech(request: Request) -> SpeechService:
    return get_runtime(request).speech


def get_library(request: Request) -> VoiceLibrary:
    return get_runtime(request).voices


def get_context(conn: HTTPConnection) -> RequestContext:
    """The request's context, looked up once for its handler (HTTP or WebSocket), which passes it on."""
    return context_of(conn.scope)


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
PoolDep = Annotated[EnginePool, Depends(get_pool)]
SpeechDep = Annotated[SpeechService, Depends(get_speech)]
LibraryDep = Annotated[VoiceLibrary, Depends(get_library)]
ContextDep = Annotated[RequestContext, Depends(get_context)]
