"""Typed dependencies: routers get the runtime's services from lifespan state, never globals."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.api.context import RequestContext, context_of
from app.runtime import Runtime
from app.serving.errors import NotReady
from app.serving.pool import EnginePool
from app.serving.speech import SpeechService
from app.voices.library import VoiceLibrary


def get_runtime(request: Request) -> Runtime:
    return request.state.runtime


def get_pool(request: Request) -> EnginePool:
    pool = get_runtime(request).pool
    if pool is None:
        raise NotReady("the engine pool is not started")
    return pool


def get_speech(request: Request) -> SpeechService:
    speech = get_runtime(request).speech
    if speech is None:
        raise NotReady("the engine pool is not started")
    return speech


def get_library(request: Request) -> VoiceLibrary:
    library = get_runtime(request).voices
    if library is None:
        raise NotReady("the voice library is not started")
    return library


def get_context(request: Request) -> RequestContext:
    return context_of(request.scope)


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
PoolDep = Annotated[EnginePool, Depends(get_pool)]
SpeechDep = Annotated[SpeechService, Depends(get_speech)]
LibraryDep = Annotated[VoiceLibrary, Depends(get_library)]
ContextDep = Annotated[RequestContext, Depends(get_context)]
