"""Notice a client that hangs up while its request waits or runs (before any response byte).

Once the body has been read, the only message the server can still receive is
``http.disconnect``. ``watch_disconnect`` listens for it in a task and sets an
event the speech service races against. It must stop before a streaming
response starts: Starlette's ``StreamingResponse`` listens for the disconnect
itself from then on (and cancels the stream when it comes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.requests import Request


@asynccontextmanager
async def watch_disconnect(request: Request) -> AsyncIterator[asyncio.Event]:
    gone = asyncio.Event()

    async def listen() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone.set()
                return

    task = asyncio.ensure_future(listen())
    try:
        yield gone
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
