"""The edge as plain ASGI: bodies read before a permit, bounded in size, time, number and bytes;
503 before any body; refusals paced under a storm (app/api/admission.py, bodies.py, refusals.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.api.admission import AdmissionMiddleware
from app.api.bodies import BodyGate, BodyLimits
from app.api.context import context_of
from app.api.refusals import MAX_HOLD_S, RefusalPacer
from app.serving.errors import Overloaded
from tests.support.waiting import await_until, run


class Ticket:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.pool.out -= 1


class Pool:
    """What the edge needs of EnginePool: its gate's check() and admit() (one class here; the pool is its gate)."""

    def __init__(self, places: int = 1) -> None:
        self.gate = self
        self.places = places
        self.out = 0
        self.checks = 0

    def check(self, priority: object) -> None:
        self.checks += 1
        if self.out >= self.places:
            raise Overloaded("full", 2.0)

    async def admit(self, priority: object, client: str = "") -> Ticket:
        self.check(priority)
        self.out += 1
        return Ticket(self)


def scope(path: str = "/v1/tts", headers: dict[str, str] | None = None, method: str = "POST") -> dict:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return {"type": "http", "method": method, "path": path, "headers": raw, "query_string": b""}


class Wire:
    """The client side: body messages fed on demand; what the server sent."""

    def __init__(self, parts: list[bytes] | None = None, then_wait: bool = False) -> None:
        self.parts = list(parts or [])
        self.then_wait = then_wait
        self.received = 0  # receive() calls
        self.sent: list[dict] = []
        self.more = asyncio.Event()

    async def receive(self) -> dict:
        self.received += 1
        if self.parts:
            part = self.parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(self.parts) or self.then_wait}
        if self.then_wait:
            await self.more.wait()
            self.then_wait = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # nothing more from this client
        raise AssertionError("unreachable")

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return {k.decode(): v.decode() for k, v in start["headers"]}

    @property
    def error(self) -> dict:
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        return json.loads(body)["error"]


class App:
    """The router behind the edge: records the body it read and whether a permit was held."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.bodies: list[bytes] = []
        self.permits_seen: list[int] = []

    async def __call__(self, scope: dict, receive, send) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        self.permits_seen.append(self.pool.out)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})


def edge(pool: Pool | None, **limits) -> tuple[AdmissionMiddleware, App, BodyGate]:
    lim = {"max_bytes": 1000, "max_plain_bytes": 1000, "timeout_s": 5.0, "max_reads": 4, "max_buffered_bytes": 10_000,
           **limits}
    gate = BodyGate(BodyLimits(**lim))
    app = App(pool or Pool())
    return AdmissionMiddleware(app, lambda: pool, gate, RefusalPacer(0)), app, gate


def test_the_permit_is_taken_only_once_the_body_is_in() -> None:
    async def main():
        pool = Pool(places=1)
        mw, app, gate = edge(pool)
        slow = Wire([b'{"text": '], then_wait=True)
        task = asyncio.ensure_future(mw(scope(headers={"content-length": "20"}), slow.receive, slow.send))
        await await_until(lambda: gate.reading == 1)
        assert pool.out == 0, "no permit while the body arrives"
        fast = Wire([b'{"text": "hi"}'])
        await mw(scope(headers={"content-length": "14"}), fast.receive, fast.send)
        assert fast.status == 200 and app.permits_seen == [1]  # the handler ran with its permit
        slow.more.set()
        await task
        assert slow.status == 200 and pool.out == 0 and gate.reading == 0 and gate.buffered == 0
        assert app.bodies == [b'{"text": "hi"}', b'{"text": ']

    run(main())


def test_overload_is_refused_before_a_byte_of_the_body_is_read() -> None:
    async def main():
        pool = Pool(places=0)
        mw, app, gate = edge(pool)
        wire = Wire([b"x" * 100])
        await mw(scope(headers={"content-length": "100"}), wire.receive, wire.send)
        assert wire.status == 503 and wire.received == 0 and app.bodies == []
        assert wire.headers["retry-after"] == "2" and wire.error["code"] == "overloaded"

    run(main())


def test_a_declared_length_over_the_limit_is_413_before_reading_and_closes() -> None:
    async def main():
        for path, pool in (("/v1/tts", Pool()), ("/v1/voices", None)):  # synthesis and any other body
            mw, app, gate = edge(pool)
            wire = Wire([b"x" * 100])
            await mw(scope(path, headers={"content-length": str(200 << 20)}), wire.receive, wire.send)
            assert wire.status == 413 and wire.received == 0 and app.bodies == []
            assert wire.headers["connection"] == "close" and "209715200 bytes" in wire.error["message"]
            assert gate.refused == {"too_large": 1} and (pool is None or pool.out == 0)

    run(main())


def test_a_body_without_uploads_has_the_smaller_limit_of_text_and_fields() -> None:
    async def main():
        mw, app, gate = edge(Pool(), max_bytes=5000, max_plain_bytes=500)
        json_body = Wire([b"x" * 100])
        await mw(scope(headers={"content-length": "600", "content-type": "application/json"}), json_body.receive,
                 json_body.send)
        assert json_body.status == 413 and json_body.received == 0  # a 1 MB prompt_text never gets read
        assert "server.max_text_chars" in json_body.error["message"]
        assert "connection" not in json_body.headers  # a small one: the parser reads past it, no reset
        form = Wire([b"x" * 600])
        await mw(scope(headers={"content-length": "600", "content-type": "multipart/form-data; boundary=b"}),
                 form.receive, form.send)
        assert form.status == 200 and app.bodies == [b"x" * 600]  # uploaded audio: server.max_upload_mb

    run(main())


def test_a_chunked_body_is_cut_at_the_limit() -> None:
    async def main():
        mw, app, gate = edge(Pool(), max_bytes=1000)
        wire = Wire([b"x" * 400] * 10)
        await mw(scope(headers={"transfer-encoding": "chunked"}), wire.receive, wire.send)
        assert wire.status == 413 and wire.received == 3  # 1200 bytes > 1000: the rest is never read
        assert app.bodies == [] and gate.buffered == 0 and gate.reading == 0

    run(main())


def test_a_body_that_does_not_arrive_in_time_is_408_and_holds_nothing() -> None:
    async def main():
        pool = Pool()
        mw, app, gate = edge(pool, timeout_s=0.2)
        wire = Wire([b"{"], then_wait=True)
        await mw(scope(headers={"content-length": "50"}), wire.receive, wire.send)
        assert wire.status == 408 and wire.error["code"] == "body_timeout" and "0.2 s" in wire.error["message"]
        assert pool.out == 0 and gate.reading == 0 and gate.buffered == 0 and gate.refused == {"timeout": 1}

    run(main())


def test_body_reads_are_bounded_in_number_and_in_bytes() -> None:
    async def main():
        mw, app, gate = edge(Pool(places=10), max_reads=2, max_buffered_bytes=1500, max_bytes=1000, wait_s=0.1)
        hold = [Wire([b"a"], then_wait=True) for _ in range(2)]
        tasks = [asyncio.ensure_future(mw(scope(headers={"content-length": "10"}), w.receive, w.send))
                 for w in hold]
        await await_until(lambda: gate.reading == 2)
        third = Wire([b"b"])  # both places held by dribblers: it waits wait_s for one, then 503
        await mw(scope(headers={"content-length": "1"}), third.receive, third.send)
        assert third.status == 503 and third.error["code"] == "overloaded" and third.received == 0
        assert "within 0.1 s" in third.error["message"]
        for w in hold:
            w.more.set()
        await asyncio.gather(*tasks)
        big = Wire([b"c"], then_wait=True)  # reserves its declared 1000 bytes
        task = asyncio.ensure_future(mw(scope(headers={"content-length": "1000"}), big.receive, big.send))
        await await_until(lambda: gate.reading == 1)
        assert gate.buffered == 1000
        other = Wire([b"d"])
        await mw(scope(headers={"content-length": "600"}), other.receive, other.send)
        assert other.status == 503, "1000 + 600 bytes would pass the 1500 the bodies may hold"
        big.more.set()
        await task
        assert gate.refused == {"busy": 2} and gate.buffered == 0

    run(main())


def test_a_burst_of_fast_bodies_beyond_the_read_places_is_read_in_turn_not_refused() -> None:
    """200 bulk requests sent at once (issue 39): with 4 read places every body waits its turn, FIFO;
    past 8 waiters per place a body is refused at once."""

    async def main():
        mw, app, gate = edge(Pool(places=500), max_reads=4)
        wires = [Wire([b"x" * 8], then_wait=True) for _ in range(30)]  # 4 read, 26 wait (at most 8 x 4 may)
        tasks = [asyncio.ensure_future(mw(scope(headers={"content-length": "8"}), w.receive, w.send)) for w in wires]
        await await_until(lambda: gate.reading == 4 and len(gate._waiters) == 26)
        for w in wires:  # the bytes arrive
            w.more.set()
        await asyncio.gather(*tasks)
        assert [w.status for w in wires] == [200] * 30 and gate.refused == {}
        assert gate.reading == 0 and not gate._waiters and gate.buffered == 0
        hold = [Wire([b"y"], then_wait=True) for _ in range(4 + 32)]
        tasks = [asyncio.ensure_future(mw(scope(headers={"content-length": "1"}), w.receive, w.send)) for w in hold]
        await await_until(lambda: len(gate._waiters) == 32)
        extra = Wire([b"z"])
        await mw(scope(headers={"content-length": "1"}), extra.receive, extra.send)
        assert extra.status == 503 and gate.refused == {"busy": 1}
        for w in hold:
            w.more.set()
        await asyncio.gather(*tasks)

    run(main())


def test_a_waiter_that_leaves_passes_no_place_on_twice() -> None:
    async def main():
        mw, app, gate = edge(Pool(places=10), max_reads=1, wait_s=5.0)
        first = Wire([b"a"], then_wait=True)
        t1 = asyncio.ensure_future(mw(scope(headers={"content-length": "1"}), first.receive, first.send))
        await await_until(lambda: gate.reading == 1)
        waiting = [Wire([b"b"]) for _ in range(2)]
        tasks = [asyncio.ensure_future(mw(scope(headers={"content-length": "1"}), w.receive, w.send)) for w in waiting]
        await await_until(lambda: len(gate._waiters) == 2)
        tasks[0].cancel()  # its client left while it waited
        await asyncio.gather(tasks[0], return_exceptions=True)
        first.more.set()
        await asyncio.gather(t1, tasks[1])
        assert first.status == 200 and waiting[1].status == 200
        assert gate.reading == 0 and not gate._waiters

    run(main())


def test_a_client_that_leaves_mid_body_gets_nothing_and_frees_its_place() -> None:
    async def main():
        pool = Pool()
        mw, app, gate = edge(pool)
        sent: list[dict] = []
        messages = [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}]

        async def receive() -> dict:
            return messages.pop(0)

        async def send(m: dict) -> None:
            sent.append(m)

        sc = scope(headers={"content-length": "50"})
        await mw(sc, receive, send)
        assert sent == [] and gate.reading == 0 and pool.out == 0 and app.bodies == []
        assert context_of(sc).error_code == "client_closed_request"  # logged as 499, not as a 500

    run(main())


def test_requests_without_a_body_pass_straight_through() -> None:
    async def main():
        mw, app, gate = edge(None)
        wire = Wire([b""])
        await mw(scope("/v1/speakers", method="GET"), wire.receive, wire.send)
        assert wire.status == 200 and gate.reading == 0 and wire.received == 1  # the app read, not the edge

    run(main())


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_refusals_go_out_at_once_up_to_the_rate_then_are_held_in_turn() -> None:
    clock = Clock()
    pacer = RefusalPacer(10, clock=clock)
    assert [pacer.hold_s() for _ in range(10)] == [0.0] * 10  # a second's worth at once
    holds = [pacer.hold_s() for _ in range(5)]
    assert holds == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])  # then one every 1/rate seconds
    clock.t += 10.0  # a quiet spell refills the bucket
    assert pacer.hold_s() == 0.0


def test_a_flood_past_the_longest_hold_is_answered_at_once() -> None:
    clock = Clock()
    pacer = RefusalPacer(10, clock=clock)
    holds = [pacer.hold_s() for _ in range(10 + int(10 * MAX_HOLD_S) + 5)]
    assert max(holds) <= MAX_HOLD_S
    assert holds[-1] == 0.0  # beyond what holding can bound: no more held coroutines


def test_no_pacing_when_the_rate_is_zero() -> None:
    pacer = RefusalPacer(0)
    assert all(pacer.hold_s() == 0.0 for _ in range(1000))


def test_the_edge_holds_503s_beyond_the_rate() -> None:
    async def main():
        pool = Pool(places=0)
        gate = BodyGate(BodyLimits(max_bytes=1000, timeout_s=5.0))
        pacer = RefusalPacer(5)
        mw = AdmissionMiddleware(App(pool), lambda: pool, gate, pacer)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        held = []
        for _ in range(7):
            wire, sc = Wire(), scope(method="GET", path="/inference_sft")
            await mw(sc, wire.receive, wire.send)
            assert wire.status == 503
            held.append(round(context_of(sc).held_s, 1))  # the access log says how long each was held
        elapsed = loop.time() - t0
        assert held == [0.0] * 5 + [0.2, 0.2]  # one every 1/rate s after the burst
        assert pacer.held_total == 2 and 0.3 <= elapsed < 2.0  # the 6th and the 7th waited 0.2 s each
        assert pacer.held == 0

    run(main())


class Refusing(App):
    """A handler that refuses the request (a 4xx after the permit was taken), noting the permits out then."""

    async def __call__(self, scope: dict, receive, send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 400, "headers": []})
        self.permits_seen.append(self.pool.out)
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})


def test_a_handlers_error_is_paced_too_and_its_permit_is_free_before_it_waits() -> None:
    async def main():
        pool = Pool(places=1)
        pacer = RefusalPacer(2)
        app = Refusing(pool)
        mw = AdmissionMiddleware(app, lambda: pool, BodyGate(BodyLimits(max_bytes=1000, timeout_s=5.0)), pacer)
        for _ in range(4):  # a client resending a request that is refused (a 1 MB field, say) without pause
            wire = Wire([b"{}"])
            await mw(scope(headers={"content-length": "2"}), wire.receive, wire.send)
            assert wire.status == 400
        assert pacer.held_total == 2 and app.permits_seen == [0, 0, 0, 0] and pool.out == 0

    run(main())
