"""Raw HTTP/1.1 over loopback sockets for the abuse suite's adversaries: a request's head, the status of an
answer, and what a socket that reads nothing can still learn (its TCP state, the bytes queued, a peek)."""

from __future__ import annotations

import asyncio
import fcntl
import socket
import termios

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
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
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
