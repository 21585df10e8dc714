"""The abuse suite's adversaries in their own process (``python -m bench.lib.abuse_clients KIND --url URL --clients N
--seconds S``): prints ``ready``, runs (loopback only, every loop bounded), then the ``Tally`` as one JSON line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import functools
import json
import signal
import socket
import termios
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

import httpx
import psutil

from bench.lib.admission_server import TEXT
from bench.lib.load import retry_pause_s

TCP_CLOSE_WAIT, TCP_CLOSE = 8, 7  # Linux tcp_states.h


def status_of(head: bytes) -> str:
    """``"413"`` from ``b"HTTP/1.1 413 ..."``; ``"garbled"`` otherwise."""
    parts = head.split(b" ", 2)
    return parts[1].decode() if len(parts) > 1 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else "garbled"


def request_head(host: str, path: str, length: int | None) -> bytes:
    """A POST's head; ``length`` None: a chunked body."""
    size = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{size}\r\n\r\n".encode()


async def connect(host: str, port: int, sndbuf: int = 0, rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for option, size in ((socket.SO_SNDBUF, sndbuf), (socket.SO_RCVBUF, rcvbuf)):
        if size:
            sock.setsockopt(socket.SOL_SOCKET, option, size)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def tcp_state(sock: socket.socket) -> int | None:
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
    except (OSError, AttributeError):
        return None


def queued(sock: socket.socket) -> int:
    """Bytes received and not read (FIONREAD)."""
    try:
        return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"), "little")
    except OSError:
        return 0


def peek(sock: socket.socket) -> bytes:
    try:
        return sock.recv(64, socket.MSG_PEEK)
    except (BlockingIOError, OSError):
        return b""


MAX_ATTEMPTS = 100_000  # per client and phase: a bound on every reconnect / retry loop
MAX_SAMPLES = 20_000  # per list in the tally
RECONNECT_S = 0.25  # pause before a raw-socket or WebSocket client reconnects
SLOW_HEAD_EVERY_S = 5.0  # a slow head's client sends one byte this often
LONG_TEXT = " ".join([TEXT] * 28)  # ~2,000 characters: a stream that lasts
UTTERANCE = " ".join([TEXT] * 57)[:4000]  # 4,000 characters: one long utterance (WebSocket) or request (HTTP)
GIANT = 1_000_000  # characters of a giant field
HUGE = 200 * 1024 * 1024  # the declared body of the huge-body client
CHUNK = 64 * 1024
SNDBUF = 64 * 1024  # the huge-body client's send buffer: it has sent at most this much more than the server read
RCVBUF = 4096  # the non-reader's receive buffer


@dataclass
class Tally:
    """What one adversary saw: answers by kind, time to each answer (s), bytes sent before each answer."""

    kind: str
    clients: int
    attempts: int = 0
    answers: dict[str, int] = field(default_factory=dict)  # "408", "closed", "open at end", "ws close 1013", ...
    answer_s: list[float] = field(default_factory=list)
    sent_bytes: list[int] = field(default_factory=list)  # per attempt, counting those still open at the end
    received_bytes: list[int] = field(default_factory=list)  # non-readers: bytes queued unread when closed / at end
    ok: list[list[float]] = field(default_factory=list)  # storms: [start, latency] of each 200
    rejected: dict[str, int] = field(default_factory=dict)  # storms: 503s by the tenth of a second they ended in
    errors: list[str] = field(default_factory=list)
    audio_s: float = 0.0  # long speakers: seconds of audio received in all
    audio_wall_s: float = 0.0  # ... and the wall seconds its finished requests took

    def count(self, answer: str, after_s: float | None = None, sent: int | None = None) -> None:
        self.answers[answer] = self.answers.get(answer, 0) + 1
        for values, v in ((self.answer_s, after_s), (self.sent_bytes, sent)):
            if v is not None and len(values) < MAX_SAMPLES:
                values.append(v)

    def note(self, text: str) -> None:
        if len(self.errors) < 10:
            self.errors.append(text[:300])


class Adversaries:
    def __init__(self, url: str, seconds: float, server_pid: int | None = None) -> None:
        u = urlsplit(url)
        self.url, self.host, self.port = url, u.hostname or "127.0.0.1", u.port or 80
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the abuse suite only talks to loopback")
        self.end = time.monotonic() + seconds
        self.server = psutil.Process(server_pid) if server_pid else None
        self._peers: tuple[float, set[int] | None] = (0.0, None)

    def server_peers(self) -> set[int] | None:
        """The client ports of the connections the server process holds open (read at most every 0.5 s; None: not
        known). A server that closes a connection whose unsent audio waits behind a zero window sends its FIN
        only after that audio, so a client that reads nothing learns of the close only from here."""
        at, peers = self._peers
        if self.server is not None and time.monotonic() - at >= 0.5:
            try:
                peers = {c.raddr.port for c in self.server.net_connections("tcp") if c.raddr}
            except psutil.Error:
                peers = None
            self._peers = (time.monotonic(), peers)
        return peers

    def left(self) -> float:
        return self.end - time.monotonic()

    def tries(self, tally: Tally) -> Iterator[float]:
        """One client's attempts, bounded in time (``left``) and in count (MAX_ATTEMPTS): each its start time."""
        for _ in range(MAX_ATTEMPTS):
            if self.left() <= 0:
                return
            tally.attempts += 1
            yield time.monotonic()

    async def raw_attempts(self, tally: Tally, attempt, **buffers: int) -> None:
        """``attempt(tally, sock, t0)`` on a fresh loopback socket per attempt (``buffers``: its sizes, ``connect``);
        one that returns True has been served and asks for nothing more until the end."""
        for t0 in self.tries(tally):
            try:
                sock = await connect(self.host, self.port, **buffers)
                try:
                    served = await attempt(tally, sock, t0)
                finally:
                    sock.close()
                if served:
                    await asyncio.sleep(max(0.0, self.left()))
            except OSError as exc:
                tally.count(f"socket error {type(exc).__name__}")
                tally.note(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(min(RECONNECT_S, max(0.0, self.left())))

    async def dribble(self, tally: Tally, sock: socket.socket, t0: float, slow_head: bool = False) -> None:
        """Headers at once, then the body one byte a second; until the server answers or closes. ``slow_head``: the
        request line at once, then one byte of a header every ``SLOW_HEAD_EVERY_S`` (the head never ends)."""
        if slow_head:
            first = request_head(self.host, "/v1/tts", 0).split(b"\r\n", 1)[0] + b"\r\n"
            rest, every_s = b"X-Slow: " + b"a" * 1000, SLOW_HEAD_EVERY_S
        else:
            first = request_head(self.host, "/v1/tts", 400)
            rest, every_s = json.dumps({"text": TEXT, "format": "pcm"}).encode().ljust(400), 1.0  # JSON may end in spaces
        loop, sent = asyncio.get_running_loop(), 0
        try:
            await loop.sock_sendall(sock, first)
            while sent < len(rest) and self.left() > 0:
                await loop.sock_sendall(sock, rest[sent:sent + 1])
                sent += 1
                try:
                    head = await asyncio.wait_for(loop.sock_recv(sock, 4096), min(every_s, max(0.01, self.left())))
                except TimeoutError:
                    continue
                tally.count(status_of(head) if head else "closed", time.monotonic() - t0, sent)
                return
            tally.count("open at end" if sent < len(rest) else "body complete", time.monotonic() - t0, sent)
        except (ConnectionError, BrokenPipeError):
            tally.count("reset", time.monotonic() - t0, sent)

    async def nonread(self, tally: Tally, sock: socket.socket, t0: float) -> bool:
        """A long streamed request from a socket that reads nothing; watches for the server closing it.

        Polite about admission (a 503's Retry-After is honoured), rude about the stream: once admitted it never
        reads a byte. 48 kHz PCM makes the answer (~5 MB) larger than the kernel's socket buffers (~3 MB on
        loopback), so the server has to hold the rest.
        """
        body = json.dumps({"text": LONG_TEXT, "stream": True, "format": "pcm", "sample_rate": 48000}).encode()
        await asyncio.get_running_loop().sock_sendall(sock, request_head(self.host, "/v1/tts", len(body)) + body)
        mine, head = sock.getsockname()[1], b""
        while not head and self.left() > 0:  # the status line, without reading the audio behind it
            await asyncio.sleep(0.1)
            head = peek(sock)
        if head and status_of(head) == "503":
            tally.count("503 (Retry-After honoured)", time.monotonic() - t0)
            await asyncio.sleep(min(retry_after(head), max(0.0, self.left())))
            return False
        how = "still open at end"
        while self.left() > 0:
            await asyncio.sleep(min(0.5, max(0.0, self.left())))
            peers, closed = self.server_peers(), tcp_state(sock) in (TCP_CLOSE_WAIT, TCP_CLOSE)
            if closed or (peers is not None and mine not in peers):
                how = "then closed" if closed else "then let go by the server"
                break
        head = peek(sock)
        tally.count(f"{status_of(head) if head else 'no answer'} {how}", time.monotonic() - t0)
        tally.received_bytes.append(queued(sock))
        return True  # served (and maybe let go): it asks for nothing more

    async def huge(self, tally: Tally, sock: socket.socket, t0: float, chunked: bool = False) -> None:
        """Declares a 200 MB body and sends it as fast as it can, until the server answers or closes; ``chunked``:
        no length declared, the same bytes in chunks (``sent`` counts the body's bytes, not the framing)."""
        loop, chunk, sent = asyncio.get_running_loop(), b" " * CHUNK, 0
        if chunked:
            chunk = f"{CHUNK:x}\r\n".encode() + chunk + b"\r\n"
        reply = None
        try:
            await loop.sock_sendall(sock, request_head(self.host, "/v1/tts", None if chunked else HUGE))
            reply = asyncio.ensure_future(loop.sock_recv(sock, 4096))
            while sent < HUGE and not reply.done() and self.left() > 0:
                send = asyncio.ensure_future(loop.sock_sendall(sock, chunk))  # HUGE is a whole number of CHUNKs
                await asyncio.wait([send, reply], timeout=max(0.01, self.left()), return_when=asyncio.FIRST_COMPLETED)
                if not send.done():
                    send.cancel()
                    with contextlib.suppress(asyncio.CancelledError, OSError):
                        await send
                    break
                if send.exception() is not None:
                    break
                sent += CHUNK
            if not reply.done():  # all sent (or the send failed): wait for the answer
                await asyncio.wait([reply], timeout=max(0.01, self.left()))
            if reply.done() and reply.exception() is None:
                head = reply.result()
                tally.count(status_of(head) if head else "closed", time.monotonic() - t0, sent)
            elif reply.done():
                tally.count("reset", time.monotonic() - t0, sent)
            else:
                tally.count("open at end", time.monotonic() - t0, sent)
        finally:
            if reply is not None and not reply.done():
                reply.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await reply

    async def ws_attempts(self, tally: Tally, session, failed: str, reconnect: bool, **options) -> None:
        """``session(ws, t0)`` on a fresh WebSocket per attempt; refusals and failures (``failed``) counted."""
        from websockets.asyncio.client import connect as ws_connect
        from websockets.exceptions import InvalidStatus, WebSocketException

        url = f"ws://{self.host}:{self.port}/v1/audio/speech/stream"
        for t0 in self.tries(tally):
            try:
                async with ws_connect(url, open_timeout=10, close_timeout=2, **options) as ws:
                    await session(ws, t0)
            except InvalidStatus as exc:
                tally.count(f"http {exc.response.status_code}", time.monotonic() - t0)
            except (OSError, TimeoutError, WebSocketException) as exc:
                tally.count(f"{failed} {type(exc).__name__}", time.monotonic() - t0)
                tally.note(f"{type(exc).__name__}: {exc}")
            if reconnect:
                await asyncio.sleep(min(RECONNECT_S, max(0.0, self.left())))

    async def ws(self, tally: Tally, chatty: bool) -> None:
        """A WebSocket session that never sends text (chatty: a session.config every 3 s); reconnects when closed."""
        from websockets.exceptions import ConnectionClosed

        async def session(ws, t0: float) -> None:
            try:
                while self.left() > 0:
                    try:
                        msg = await asyncio.wait_for(ws.recv(), min(3.0, max(0.01, self.left())))
                    except TimeoutError:
                        if chatty:
                            await ws.send(json.dumps({"type": "session.config"}))
                        continue
                    if isinstance(msg, str) and '"error"' in msg:
                        tally.count(f"error event {json.loads(msg).get('error', {}).get('code', '?')}")
                tally.count("open at end", time.monotonic() - t0)
            except ConnectionClosed as exc:
                tally.count(f"ws close {exc.rcvd.code if exc.rcvd is not None else 'none'}", time.monotonic() - t0)

        await self.ws_attempts(tally, session, "connect error", reconnect=True)

    async def ws_long(self, tally: Tally) -> None:
        """One WebSocket utterance of 4,000 characters (``input.text`` then ``input.done``) after another."""
        async def session(ws, t0: float) -> None:
            await ws.send(json.dumps({"type": "input.text", "text": UTTERANCE}))
            await ws.send(json.dumps({"type": "input.done"}))
            while True:
                msg = await asyncio.wait_for(ws.recv(), max(0.01, self.left() + 60))
                event = {"type": None} if isinstance(msg, bytes) else json.loads(msg)
                if event["type"] == "audio.done":
                    tally.audio_s += event["audio_seconds"]
                    tally.audio_wall_s += time.monotonic() - t0
                    tally.count("audio.done", time.monotonic() - t0)
                    return
                if event["type"] == "error":
                    tally.count(f"error event {event['error']['code']}", time.monotonic() - t0)
                    return

        await self.ws_attempts(tally, session, "ws error", reconnect=False, max_size=None)

    async def http_attempts(self, tally: Tally, attempt, timeout_s: float, path: str = "", timed: bool = False,
                            **options) -> None:
        """``attempt(client, t0)`` in a closed loop on one httpx client; a request without an answer is counted
        (``path`` after its label, ``timed``: with its time)."""
        async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                     **options) as client:
            for t0 in self.tries(tally):
                try:
                    await attempt(client, t0)
                except httpx.HTTPError as exc:
                    label = f"no answer ({type(exc).__name__})" + (f" {path}" if path else "")
                    tally.count(label, time.monotonic() - t0 if timed else None)
                    tally.note(f"{type(exc).__name__}: {exc}")

    async def http_long(self, tally: Tally) -> None:
        """The same 4,000 characters as one streamed PCM ``/v1/tts`` request, one after another."""
        async def attempt(client: httpx.AsyncClient, t0: float) -> None:
            body = {"text": UTTERANCE, "format": "pcm", "stream": True}
            async with client.stream("POST", "/v1/tts", json=body) as r:
                got = 0
                async for part in r.aiter_raw():
                    got += len(part)
            tally.count(str(r.status_code), time.monotonic() - t0)
            if r.status_code == 200:
                tally.audio_s += got / 2 / int(r.headers["x-sample-rate"])
                tally.audio_wall_s += time.monotonic() - t0
            else:
                await asyncio.sleep(1.0)

        await self.http_attempts(tally, attempt, 600.0)

    async def giant(self, tally: Tally, openai: bool) -> None:
        """A 1 MB field (``prompt_text`` on /v1/tts; ``instructions`` on /v1/audio/speech), in a closed loop."""
        if openai:
            path, body = "/v1/audio/speech", {"model": "tts-1", "voice": "alloy", "input": "hello",
                                              "instructions": "x" * GIANT}
        else:
            path, body = "/v1/tts", {"text": "hello", "format": "pcm", "prompt_text": "x" * GIANT}
        content = json.dumps(body).encode()

        async def attempt(client: httpx.AsyncClient, t0: float) -> None:
            r = await client.post(path, content=content, headers={"content-type": "application/json"})
            tally.count(f"{r.status_code} {path}", time.monotonic() - t0, len(content))

        await self.http_attempts(tally, attempt, 60.0, path, timed=True)

    async def storm(self, tally: Tally, fresh: bool) -> None:
        """A client that retries at once on a 503 (no backoff, Retry-After ignored); ``fresh``: a new connection
        per request."""
        from bench.lib.admission_server import work

        spec = work()

        async def attempt(client: httpx.AsyncClient, t0: float) -> None:
            async with client.stream(spec.method, spec.path, json=spec.json) as r:
                async for _part in r.aiter_raw():
                    pass
            now = time.monotonic()
            # the time to a refusal is what a no-backoff client waits between tries
            tally.count(str(r.status_code), now - t0 if r.status_code != 200 else None)
            if r.status_code == 200 and len(tally.ok) < MAX_SAMPLES:
                tally.ok.append([t0, now - t0])
            elif r.status_code == 503:
                tally.rejected[f"{now:.1f}"] = tally.rejected.get(f"{now:.1f}", 0) + 1

        limits = httpx.Limits(max_connections=1, max_keepalive_connections=0 if fresh else 1)
        await self.http_attempts(tally, attempt, 120.0, limits=limits)


# kind -> one client's loop (``i``: the client's index)
ADVERSARIES = {
    "dribble": lambda adv, tally, i: adv.raw_attempts(tally, adv.dribble),
    "slow-head": lambda adv, tally, i: adv.raw_attempts(tally, functools.partial(adv.dribble, slow_head=True)),
    "nonread": lambda adv, tally, i: adv.raw_attempts(tally, adv.nonread, rcvbuf=RCVBUF),
    "ws-idle": lambda adv, tally, i: adv.ws(tally, chatty=False),
    "ws-chatty": lambda adv, tally, i: adv.ws(tally, chatty=True),
    "ws-long": lambda adv, tally, i: adv.ws_long(tally),
    "http-long": lambda adv, tally, i: adv.http_long(tally),
    "giant": lambda adv, tally, i: adv.giant(tally, openai=i % 2 == 1),
    "huge": lambda adv, tally, i: adv.raw_attempts(tally, adv.huge, sndbuf=SNDBUF),
    "huge-chunked": lambda adv, tally, i: adv.raw_attempts(tally, functools.partial(adv.huge, chunked=True),
                                                           sndbuf=SNDBUF),
    "storm": lambda adv, tally, i: adv.storm(tally, fresh=False),
    "storm-fresh": lambda adv, tally, i: adv.storm(tally, fresh=True),
}


async def run(kind: str, url: str, clients: int, seconds: float, server_pid: int | None = None) -> Tally:
    adv, tally = Adversaries(url, seconds, server_pid), Tally(kind, clients)

    def stop() -> None:  # SIGUSR1: the measured window is over, end now (every loop checks left())
        adv.end = time.monotonic()

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, stop)
    tasks = [asyncio.ensure_future(ADVERSARIES[kind](adv, tally, i)) for i in range(clients)]
    _, late = await asyncio.wait(tasks, timeout=seconds + 15)  # an answer awaited past the end is not waited out
    for t in late:
        t.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            tally.note(f"client failed: {type(t.exception()).__name__}: {t.exception()}")
    if late:
        tally.note(f"{len(late)} client(s) still waiting {seconds + 15:.0f} s after the start; cancelled")
    return tally


def retry_after(head: bytes) -> float:
    """A 503's Retry-After in seconds (1 when absent or unreadable)."""
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"retry-after":
            return retry_pause_s(value.strip().decode(errors="replace"))
    return 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=ADVERSARIES)
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--server-pid", type=int, help="the server's pid: non-readers see which connections it holds")
    args = ap.parse_args(argv)
    print("ready", flush=True)
    tally = asyncio.run(run(args.kind, args.url, args.clients, args.seconds, args.server_pid))
    print(json.dumps(asdict(tally)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
