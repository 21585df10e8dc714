"""HTTP by hand over a socket, to a live server: a request head sent alone, a body that dribbles in."""

from __future__ import annotations

import socket

from tests.support.server import ServerProcess


def raw_request(srv: ServerProcess, head_and_part: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sock.sendall(head_and_part)
    return sock


def read_response(sock: socket.socket) -> bytes:
    data = b""
    while True:
        part = sock.recv(65536)
        if not part:
            return data
        data += part


def post_head(length: int) -> bytes:
    return (f"POST /v1/tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
            "Connection: close\r\n\r\n").encode()
