"""The edge and a bulk request's wait: the class it asks the pool for, and a client that leaves while it waits."""

from __future__ import annotations

import asyncio

from app.api.admission import AdmissionMiddleware
from app.api.bodies import BodyGate, BodyLimits
from app.api.context import CLIENT_LEFT, context_of
from app.api.refusals import RefusalPacer
from app.serving.admission.classes import Priority
from tests.support.waiting import await_until, run


class Ticket:
    def __init__(self, pool: BulkPool) -> None:
        self.pool, self.held = pool, True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.pool.out -= 1


class BulkPool:
    """Interactive at once; bulk waits until ``grant`` is set (or it is cancelled)."""

    def __init__(self) -> None:
        self.out = 0
        self.grant = asyncio.Event()
        self.asked: list[tuple[Priority, str]] = []
        self.waiting = 0
        self.gave_up = 0
        self.gate = self  # the edge asks pool.gate

    async def admit(self, priority: Priority, client: str = "") -> Ticket:
        self.asked.append((priority, client))
        if priority is Priority.BULK:
            self.waiting += 1
            try:
                await self.grant.wait()
            except asyncio.CancelledError:
                self.gave_up += 1
                raise
            finally:
                self.waiting -= 1
        self.out += 1
        return Ticket(self)

    def check(self, priority: Priority | None) -> None:
        pass


class Leaving:
    """A client that sends ``parts`` (its body), then hangs up when ``leave`` is set; what it was sent."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = list(parts)
        self.leave = asyncio.Event()
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        if self.parts:
            part = self.parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(self.parts)}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)


class App:
    """The router behind the edge: the body it read and the permits out while it ran."""

    def __init__(self, pool: BulkPool) -> None:
        self.pool = pool
        self.bodies: list[bytes] = []
        self.permits_seen: list[int] = []

    async def __call__(self, scope: dict, receive, send) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        self.permits_seen.append(self.pool.out)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})


def scope(headers: dict[str, str]) -> dict:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "method": "POST", "path": "/v1/tts", "headers": raw, "query_string": b""}


def edge(pool: BulkPool) -> tuple[AdmissionMiddleware, App]:
    app = App(pool)
    gate = BodyGate(BodyLimits(max_bytes=1000, max_plain_bytes=1000, timeout_s=5.0))
    return AdmissionMiddleware(app, lambda: pool, gate, RefusalPacer(0)), app


BULK = b'{"text": "hi", "priority": "bulk"}'


def test_a_bulk_client_that_leaves_while_it_waits_gives_its_place_up() -> None:
    async def main():
        pool = BulkPool()
        mw, app = edge(pool)
        wire = Leaving([BULK])
        s = scope(headers={"content-length": str(len(BULK))})
        task = asyncio.ensure_future(mw(s, wire.receive, wire.send))
        await await_until(lambda: pool.waiting == 1)
        wire.leave.set()
        await task
        assert pool.gave_up == 1 and pool.out == 0 and not app.bodies and wire.status is None
        assert context_of(s).error_code == CLIENT_LEFT and context_of(s).priority == "bulk"

    run(main())


def test_a_bulk_request_granted_runs_with_its_body_replayed() -> None:
    async def main():
        pool = BulkPool()
        mw, app = edge(pool)
        wire = Leaving([BULK])
        task = asyncio.ensure_future(mw(scope(headers={"content-length": str(len(BULK))}), wire.receive, wire.send))
        await await_until(lambda: pool.waiting == 1)
        pool.grant.set()
        await task
        assert wire.status == 200 and app.bodies == [BULK] and app.permits_seen == [1] and pool.out == 0
        assert pool.asked == [(Priority.BULK, "-")]

    run(main())


def test_a_bulk_request_without_a_body_still_reads_its_empty_one() -> None:
    async def main():
        pool = BulkPool()
        pool.grant.set()
        mw, app = edge(pool)
        wire = Leaving([])
        await mw(scope(headers={"x-priority": "bulk"}), wire.receive, wire.send)
        assert wire.status == 200 and app.bodies == [b""] and pool.asked[0][0] is Priority.BULK

    run(main())
