"""Waiting in tests without sleeping to order events: poll a condition until a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any


def run(coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
    """Run a coroutine on a fresh event loop, failing it after ``timeout`` seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def wait_until(cond: Callable[[], bool], timeout: float = 5.0, poll_s: float = 0.001) -> None:
    """Block (a thread) until ``cond()`` holds; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(poll_s)


async def await_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """The same on the event loop: yields to other tasks between polls."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


def wait_for(pred, timeout: float, what: str) -> float:
    """Poll ``pred`` until true; returns when (monotonic). Fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"not reached within {timeout} s: {what}"
        time.sleep(0.05)
    return time.monotonic()
