"""The Wyoming listener: Home Assistant's TTS protocol on its own TCP port, in the server's process.

``app/wyoming/``: ``config.py`` the runtime config (built by ``app/settings/runtime.py`` from the
``wyoming`` section), ``info.py`` the answer to ``describe``, ``connection.py`` one client's events
driving a ``SpeechSession`` (the WebSocket route's sessions: one admission gate, limits, classes),
this module the listener, started by the lifespan once the engines are loaded and closed when it drains.

Each connection is a ``WyomingConnection`` in the runtime's ``SessionRegistry``, so the server's drain
ends it as it ends a WebSocket session: at once when idle, after its utterances when busy, closed after
``server.drain_timeout_s``. Wyoming has no authentication: a bind address beyond this machine is logged
as a warning (docs/home-assistant.md says how to keep the port on a trusted network).
"""

from __future__ import annotations

import asyncio
import logging
from importlib import metadata

from app.api.auth import is_loopback
from app.runtime import Runtime
from app.wyoming.config import WyomingConfig
from app.wyoming.connection import CappedReader, WyomingConnection

log = logging.getLogger("cosyserve.wyoming")

CLOSE_WAIT_S = 5.0  # closing waits this long for the connections' tasks after the drain closed them


def _version() -> str | None:
    try:
        return metadata.version("cosyserve")
    except metadata.PackageNotFoundError:
        return None


class WyomingServer:
    def __init__(self, runtime: Runtime, config: WyomingConfig) -> None:
        self.runtime = runtime
        self.config = config
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._version = _version()

    @property
    def port(self) -> int | None:
        """The port it listens on (``wyoming.port: 0`` picks a free one)."""
        if self._server is None or not self._server.sockets:
            return None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        c = self.config
        # limit: a header line longer than max_event_bytes ends the connection (data and payload: CappedReader)
        self._server = await asyncio.start_server(self._connected, c.host, c.port, limit=c.max_event_bytes)
        log.info("Wyoming TTS service on tcp://%s:%s (Home Assistant's Wyoming Protocol integration; "
                 "docs/home-assistant.md)", c.host, self.port)
        if not is_loopback(c.host):
            log.warning("the Wyoming service listens on %s, beyond this machine: Wyoming has no authentication "
                        "(server.api_keys do not apply to it), so anyone who can reach port %s can use it. Keep "
                        "it on a trusted network (firewall the port), docs/home-assistant.md", c.host, self.port)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            conn = WyomingConnection(CappedReader(reader, self.config.max_event_bytes), writer, self.runtime,
                                     self.config, self._version)
            await conn.serve()
        except Exception:
            log.exception("Wyoming connection failed")
            writer.close()
        finally:
            if task is not None:
                self._tasks.discard(task)

    def stop_listening(self) -> None:
        """Take no new connection (the open ones end with the drain)."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """After the drain: wait briefly for the connections' tasks, cancel what is left."""
        self.stop_listening()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CLOSE_WAIT_S)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CLOSE_WAIT_S)
        if self._server is not None:
            await self._server.wait_closed()
