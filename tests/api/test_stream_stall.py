"""A stream whose client reads nothing for server.send_timeout_s is cut (app/api/respond.py)."""

from __future__ import annotations

import asyncio
import logging

from app.api.respond import _UVICORN_INCOMPLETE, JobStreamingResponse, QuietCutFilter
from tests.support.waiting import run


async def audio(n: int):
    for _ in range(n):
        yield b"\0" * 1000


def scope() -> dict:
    return {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": "/v1/tts", "headers": []}


def uvicorn_line() -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, _UVICORN_INCOMPLETE, None, None)


def test_a_client_that_reads_nothing_is_cut_after_the_send_timeout() -> None:
    async def main():
        closed, stalled, sent = [], [], []
        never = asyncio.Event()

        async def send(message: dict) -> None:
            if len(sent) >= 3:  # the socket takes the head and two pieces, then nothing more
                await never.wait()
            sent.append(message)

        async def receive() -> dict:
            await never.wait()
            return {"type": "http.disconnect"}

        async def on_close() -> None:
            closed.append(True)

        response = JobStreamingResponse(audio(100), on_close=on_close, send_timeout_s=0.2,
                                        on_stalled=lambda: stalled.append(True))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        filtered = []

        async def serve() -> None:  # uvicorn's task: the app, then its own log line in the same context
            await response(scope(), receive, send)
            filtered.append(QuietCutFilter().filter(uvicorn_line()))

        await asyncio.ensure_future(serve())  # uvicorn runs each request in a task of its own
        assert 0.2 <= loop.time() - t0 < 2.0
        assert closed == [True] and stalled == [True] and len(sent) == 3
        assert filtered == [False], "uvicorn's 'returned without completing' line for our cut is dropped"
        assert QuietCutFilter().filter(uvicorn_line()), "elsewhere the line stays"

    run(main())


def test_a_reader_at_any_pace_is_never_cut() -> None:
    async def main():
        sent = []

        async def send(message: dict) -> None:
            await asyncio.sleep(0.01)  # slow, but it takes every piece within the timeout
            sent.append(message)

        async def receive() -> dict:
            await asyncio.Event().wait()
            return {}

        async def on_close() -> None:
            pass

        response = JobStreamingResponse(audio(30), on_close=on_close, send_timeout_s=0.2)
        await response(scope(), receive, send)
        assert len(sent) == 32 and sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}

    run(main())
