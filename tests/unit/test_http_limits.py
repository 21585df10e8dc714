"""``HeadLimitedProtocol`` on a fake transport: what the real-server tests cannot reach on purpose.

A head refused while an earlier response on the same connection is still being produced (a
pipelined request) must not write its answer into that response: the connection ends after it.
"""

from __future__ import annotations

import asyncio

from uvicorn.config import Config
from uvicorn.server import ServerState

from app.http_limits import HeadLimits, HeadRefusals, protocol


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = self.eof = self.paused = False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def write(self, data) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def make(release: asyncio.Event, limits: HeadLimits, refusals: HeadRefusals):
    async def app(scope, receive, send):
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = Config(app, lifespan="off", timeout_keep_alive=5)
    config.load()
    proto = protocol(limits, refusals)(config=config, server_state=ServerState(), app_state={},
                                       _loop=asyncio.get_running_loop())
    transport = FakeTransport()
    proto.connection_made(transport)
    return proto, transport


def test_a_pipelined_head_over_the_limit_ends_the_connection_after_the_response_in_flight():
    async def main() -> None:
        release, refusals = asyncio.Event(), HeadRefusals()
        proto, transport = make(release, HeadLimits(max_bytes=4096, max_headers=10, timeout_s=10), refusals)
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0)  # its response is being produced
        proto.data_received(b"GET /b HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
        assert refusals.counts["too_large"] == 1
        assert transport.written == b"" and transport.paused and not transport.closed
        proto.data_received(b"more")  # ignored: nothing more is read
        release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert transport.written.startswith(b"HTTP/1.1 200 ") and b"431" not in transport.written
        assert transport.closed  # the response owed, then the end
        proto.connection_lost(None)

    asyncio.run(main())


def test_the_deadline_stops_when_the_head_is_in_and_restarts_at_the_next_requests_first_byte():
    async def main() -> None:
        release, refusals = asyncio.Event(), HeadRefusals()
        release.set()
        proto, transport = make(release, HeadLimits(timeout_s=0.05), refusals)
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.1)  # past the deadline, but the head was in
        assert transport.written.startswith(b"HTTP/1.1 200 ") and not transport.closed
        proto.data_received(b"\r\n")  # the first byte after the response (a blank line, no request yet)
        await asyncio.sleep(0.1)
        assert b"HTTP/1.1 408 " in transport.written and transport.eof
        assert refusals.counts["timeout"] == 1
        proto.connection_lost(None)

    asyncio.run(main())


def test_the_server_builds_the_protocol_from_its_settings():
    from app.server import http_options
    from app.settings import load_settings

    settings = load_settings(None, server={"max_header_bytes": 8192, "max_headers": 20, "header_timeout_s": 3})
    factory = http_options(settings, None)["http"]
    assert factory.keywords["limits"] == HeadLimits(max_bytes=8192, max_headers=20, timeout_s=3.0)
