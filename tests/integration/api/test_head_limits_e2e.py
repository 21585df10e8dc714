"""Request heads are bounded on a real server (``app/http_limits.py``): size, field count, time.

Raw sockets against real uvicorn with the fake engine: an endless header is refused after
about the limit is read, never buffered whole; a head that trickles in, or never starts, is
cut at ``server.header_timeout_s`` while other clients are served; an idle kept-alive
connection is closed after ``server.keep_alive_s``; a WebSocket session outlives both timers.
"""

from __future__ import annotations

import json
import select
import socket
import time

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from tests.support.metrics import metrics
from tests.support.raw_http import read_response
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

HEADER_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 1.0
LIMIT = 65536  # server.max_header_bytes' default
SLACK_S = 1.0  # a 2-core machine running the test beside the server


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("heads")
    cfg = {"dev": {"fake_engine": True},
           "pool": {"workers": 1, "max_queue": 0, "queue_timeout_s": 30, "request_timeout_s": 30},
           "server": {"drain_timeout_s": 5, "header_timeout_s": HEADER_TIMEOUT_S, "keep_alive_s": KEEP_ALIVE_S},
           "voices": {"dir": str(tmp / "voices")}}
    with ServerProcess(tmp, cfg) as server:
        yield server


def refused(srv: ServerProcess, reason: str) -> float:
    return metrics(srv).get(f'tts_head_refused_total{{reason="{reason}"}}', 0.0)


def conn(srv: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=10)


def answered(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def exchange(srv: ServerProcess, request: bytes) -> bytes:
    """``request`` sent whole; everything the server answers until it closes."""
    with conn(srv) as sock:
        sock.sendall(request)
        return read_response(sock)


def head(target: str = "/health/live", fields: str = "", close: bool = True) -> bytes:
    return (f"GET {target} HTTP/1.1\r\nHost: x\r\n{fields}" + ("Connection: close\r\n" if close else "")
            + "\r\n").encode()


def body_of(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


def read_one(sock: socket.socket) -> bytes:
    """One response with a Content-Length, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        assert part, f"closed before a whole response: {data[:200]!r}"
        data += part
    top, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in top.lower().split(b"\r\n") if line.startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return top + b"\r\n\r\n" + body


def closed_after(sock: socket.socket, since: float) -> tuple[bytes, float]:
    """What the server sends until it closes, and when (seconds from ``since``)."""
    sock.settimeout(HEADER_TIMEOUT_S + 10)
    answer = read_response(sock)
    return answer, time.monotonic() - since


def flood(sock: socket.socket, total: int, pace_s: float) -> int:
    """Send a header value of ``total`` bytes in 64 KiB pieces (``pace_s`` apart) until the server answers;
    the bytes sent."""
    sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
    sock.setblocking(False)
    sent, piece = 0, b"a" * 65536
    try:
        while sent < total:
            readable, writable, _ = select.select([sock], [sock], [], 5)
            if readable:
                break  # the answer is there
            if writable:
                sent += sock.send(piece)
                time.sleep(pace_s)
    except OSError:
        pass  # the server closed while we were still sending
    sock.setblocking(True)
    return sent


def check_431(srv: ServerProcess, answer: bytes) -> None:
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]
    assert b"\r\nconnection: close\r\n" in answer.lower()
    error = body_of(answer)["error"]
    assert error["code"] == "request_head_too_large" and set(error) == {"code", "message", "request_id"}
    lines = [line for line in srv.log().splitlines() if "431: the request head is over 65536 bytes" in line]
    assert lines and "from 127.0.0.1:" in lines[-1] and lines[-1].endswith("connection closed")
    assert "Traceback" not in srv.log()


def test_a_100_mb_header_is_refused_after_about_the_limit_is_read(srv):
    """The client waits 20 ms after each piece, so the server reads each as it comes: what was sent
    before the answer is what the server read, plus a piece or two."""
    before = refused(srv, "too_large")
    sock = conn(srv)
    t0 = time.monotonic()
    sent = flood(sock, 100 << 20, pace_s=0.02)
    answer, took = closed_after(sock, t0)
    sock.close()
    check_431(srv, answer)
    assert sent < LIMIT + 4 * 65536, f"the client pushed {sent} bytes before the server answered"
    assert took < 1.0 + SLACK_S  # the answer and end of stream at once (the socket closes LINGER_S later)
    assert refused(srv, "too_large") == before + 1


def test_a_header_pushed_as_fast_as_possible_costs_no_memory_or_cpu(srv):
    """A client that never waits fills the kernel's socket buffers (megabytes on loopback) before it sees
    the answer; the server itself stops reading at the limit."""
    m0 = metrics(srv)
    sock = conn(srv)
    sent = flood(sock, 100 << 20, pace_s=0)
    answer, _ = closed_after(sock, time.monotonic())
    sock.close()
    check_431(srv, answer)
    assert sent < (16 << 20), f"the client pushed {sent} bytes"
    m1 = metrics(srv)
    assert m1["tts_process_peak_rss_bytes"] - m0["tts_process_peak_rss_bytes"] < (16 << 20)
    assert m1["process_cpu_seconds_total"] - m0["process_cpu_seconds_total"] < 0.5


@pytest.mark.parametrize("target, fields", [
    ("/health/live", f"X-Big: {'a' * 100_000}\r\n"),  # a 100 KB value in one read
    (f"/health/live?q={'a' * 70_000}", ""),  # the request target counts too
])
def test_a_head_over_the_limit_in_one_piece_gets_431(srv, target, fields):
    answer = exchange(srv, head(target, fields))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert body_of(answer)["error"]["code"] == "request_head_too_large"


def test_a_head_just_under_the_limit_is_served(srv):
    answer = exchange(srv, head(fields=f"X-Big: {'a' * (LIMIT - 200)}\r\n"))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_an_openai_route_gets_openais_error_object(srv):
    answer = exchange(srv, head("/v1/models", f"X-Big: {'a' * 100_000}\r\n"))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    error = body_of(answer)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "request_head_too_large"


def test_200_header_fields_get_431_and_100_are_served(srv):
    before = refused(srv, "too_many")
    answer = exchange(srv, head(fields="".join(f"X-H{i}: v\r\n" for i in range(200))))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert body_of(answer)["error"]["code"] == "too_many_headers"
    assert refused(srv, "too_many") == before + 1
    # Host, Connection and 98 more: 100 fields
    assert exchange(srv, head(fields="".join(f"X-H{i}: v\r\n" for i in range(98)))).startswith(b"HTTP/1.1 200 ")


def test_heads_that_trickle_in_get_408_at_the_deadline_while_others_are_served(srv):
    """20 clients send a byte every 0.5 s, never finishing their heads: bytes do not extend the deadline."""
    before = refused(srv, "timeout")
    t0 = time.monotonic()
    slow = [conn(srv) for _ in range(20)]
    for sock in slow:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    ends: dict[int, tuple[bytes, float]] = {}
    served = []
    while len(ends) < len(slow) and time.monotonic() - t0 < HEADER_TIMEOUT_S + 5:
        for i, sock in enumerate(slow):
            if i in ends:
                continue
            if answered(sock):
                ends[i] = closed_after(sock, t0)
                continue
            try:
                sock.send(b"a")
            except OSError:
                ends[i] = (b"", time.monotonic() - t0)
        s0 = time.monotonic()
        r = httpx.get(srv.base_url + "/health/live", timeout=5)
        served.append((r.status_code, time.monotonic() - s0))
        time.sleep(0.5)
    for sock in slow:
        sock.close()
    assert len(ends) == len(slow), "a trickling client was never cut off"
    for answer, at in ends.values():
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:200]
        assert body_of(answer)["error"]["code"] == "header_timeout"
        assert HEADER_TIMEOUT_S - 0.1 <= at <= HEADER_TIMEOUT_S + SLACK_S, at
    assert len(served) >= 3 and all(status == 200 and took < 0.5 for status, took in served), served
    assert refused(srv, "timeout") == before + len(slow)


def test_a_connection_that_sends_nothing_is_closed_at_the_deadline(srv):
    before = refused(srv, "idle")
    t0 = time.monotonic()
    with conn(srv) as sock:
        answer, took = closed_after(sock, t0)
    assert answer == b""  # no request, so no answer: closed
    assert HEADER_TIMEOUT_S - 0.1 <= took <= HEADER_TIMEOUT_S + SLACK_S, took
    assert refused(srv, "idle") == before + 1


def test_an_idle_kept_alive_connection_is_closed_after_keep_alive_s(srv):
    with conn(srv) as sock:
        sock.sendall(head(close=False))
        assert read_one(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(KEEP_ALIVE_S / 2)
        sock.sendall(head(close=False))  # a second request on the same connection: served, timers reset
        assert read_one(sock).startswith(b"HTTP/1.1 200 ")
        answer, took = closed_after(sock, time.monotonic())
    assert answer == b""
    assert KEEP_ALIVE_S - 0.1 <= took <= KEEP_ALIVE_S + SLACK_S, took


def test_a_later_heads_deadline_runs_from_its_first_byte(srv):
    with conn(srv) as sock:
        sock.sendall(head(close=False))
        assert read_one(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(KEEP_ALIVE_S / 2)
        t0 = time.monotonic()
        sock.sendall(b"G")  # stops the keep-alive timer; the head's deadline starts
        answer, took = closed_after(sock, t0)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert HEADER_TIMEOUT_S - 0.1 <= took <= HEADER_TIMEOUT_S + SLACK_S, took


def test_a_websocket_session_outlives_the_head_and_keep_alive_timers(srv):
    with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/audio/speech/stream", open_timeout=10) as ws:
        time.sleep(HEADER_TIMEOUT_S + KEEP_ALIVE_S)
        ws.send(json.dumps({"type": "input.text", "text": "still here"}))
        ws.send(json.dumps({"type": "input.done"}))
        audio, events = 0, []
        while not events or events[-1]["type"] not in ("audio.done", "error"):
            m = ws.recv(timeout=30)
            if isinstance(m, bytes):
                audio += len(m)
            else:
                events.append(json.loads(m))
    assert events[-1]["type"] == "audio.done" and audio > 0, events
