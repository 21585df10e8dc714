"""Typed dependencies: routers get the runtime's services from lifespan state, never globals."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from app.runtime import Runtime
from app.serving.errors import NotReady


def get_runtime(request: Request) -> Runtime:
    return request.state.runtime


def get_pool(request: Request) -> Any:
    pool = request.state.runtime.pool
    if pool is None:
        raise NotReady("the engine pool is not started")
    return pool


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
PoolDep = Annotated[Any, Depends(get_pool)]
