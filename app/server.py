"""Run the app under uvicorn with a graceful drain on SIGTERM / SIGINT.

On the first signal: readiness turns 503 and new synthesis requests get 503 at
once, while the server keeps listening (and answering probes) for
``server.drain_delay_s`` so load balancers notice; then WebSocket sessions end
after their current utterances (idle ones at once, the rest closed with 1001
after ``server.drain_timeout_s``); then it stops accepting
connections, lets in-flight requests and streams finish (up to
``server.drain_timeout_s``), closes the engines and exits 0. A second SIGINT
forces an immediate exit.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import signal
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from app import logredact
from app.api.auth import exposure_warning
from app.main import create_app
from app.metrics import Metrics
from app.runtime import running
from app.settings import Settings

log = logging.getLogger("cosyserve")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is not None or self._loop is None or running(self.app) is None:
            if sig == signal.SIGINT and self.should_exit:
                self.force_exit = True
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._start_drain, sig)

    def _start_drain(self, sig: int) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain(sig))

    async def _drain(self, sig: int) -> None:
        runtime = running(self.app)
        assert runtime is not None  # handle_exit drains only once the lifespan built it
        settings = runtime.settings.server
        log.info("received %s: draining (delay %.1fs, timeout %.1fs)", signal.Signals(sig).name,
                 settings.drain_delay_s, settings.drain_timeout_s)
        runtime.draining = True
        await runtime.pool.begin_drain()
        if settings.drain_delay_s > 0:
            await asyncio.sleep(settings.drain_delay_s)
        # uvicorn closes WebSockets at once (1012) when it stops: let sessions finish first
        forced = await runtime.sessions.drain(settings.drain_timeout_s)
        if forced:
            log.warning("drain timeout (%.0fs): closed %d streaming session(s) (WebSocket: 1001; Wyoming)",
                        settings.drain_timeout_s, forced)
        self.should_exit = True


def warn_if_exposed(settings: Settings) -> None:
    """Log a warning when the bind address is reachable from other machines and no keys are set."""
    warning = exposure_warning(settings.server.host, settings.server.keys)
    if warning:
        log.warning(warning)


def ws_max_size(settings: Settings) -> int:
    """The transport's cap on one WebSocket message (uvicorn closes 1009 beyond it): well above
    ``websocket.max_message_bytes``, which the session refuses with an error event and stays open."""
    return max(1024 * 1024, 4 * settings.websocket.max_message_bytes)


def http_options(settings: Settings, metrics: Metrics | None) -> dict[str, Any]:
    """uvicorn's HTTP protocol with bounded request heads (``app/http_limits.py``), counted in ``metrics``.

    Without httptools (uvicorn[standard] installs it on CPython) h11 bounds the head's size only."""
    s = settings.server
    if importlib.util.find_spec("httptools") is None:
        log.warning("httptools is not installed: request heads are limited in size only (h11), "
                    "not in fields (server.max_headers) or time (server.header_timeout_s)")
        return {"http": "h11", "h11_max_incomplete_event_size": s.max_header_bytes}
    from app.http_limits import HeadLimits, HeadRefusalCollector, HeadRefusals, protocol

    refusals = HeadRefusals()
    if metrics is not None:
        metrics.registry.register(HeadRefusalCollector(refusals))
    limits = HeadLimits(max_bytes=s.max_header_bytes, max_headers=s.max_headers, timeout_s=s.header_timeout_s)
    return {"http": protocol(limits, refusals)}


def run(settings: Settings) -> None:
    logredact.install(settings.server.keys)  # before uvicorn logs its first line: no key in any log
    warn_if_exposed(settings)
    app = create_app(settings)
    config = uvicorn.Config(
        app, host=settings.server.host, port=settings.server.port, log_config=None,
        access_log=False, timeout_graceful_shutdown=max(1, int(settings.server.drain_timeout_s)) or None,
        lifespan="on", ws_max_size=ws_max_size(settings), timeout_keep_alive=settings.server.keep_alive_s,
        **http_options(settings, app.state.boot.metrics),
    )
    DrainingServer(config, app).run()
