"""A real nginx in front of cosyserve replicas, running the shipped deploy/nginx/cosyserve.conf.

The shipped file is used as is except for its upstream ``server`` lines (one per replica given,
keeping the shipped parameters) and its ``listen`` line. nginx runs in the foreground on an
unprivileged loopback port, with every path (pid, logs, temp dirs) in a temp dir.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

from tests.support.paths import ROOT

SHIPPED = ROOT / "deploy" / "nginx" / "cosyserve.conf"
_SERVER_LINE = re.compile(r"^([ \t]*)server[ \t]+\S+:\d+([ \t]+[^;\n]*)?;[ \t]*$", re.MULTILINE)
_SERVER_BLOCK = re.compile(r"(?:^[ \t]*server[ \t]+\S+:\d+[^;\n]*;[ \t]*\n)+", re.MULTILINE)
_LISTEN_LINE = re.compile(r"^([ \t]*)listen[ \t]+\S+;[ \t]*$", re.MULTILINE)


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if os.access(p, os.X_OK)), None)
    if found is None:
        raise RuntimeError("nginx is not installed: run `make test-deps` (installs the Debian nginx-light package)")
    return found


def render(upstreams: list[str], port: int, shipped: str | None = None) -> str:
    """The shipped config with ``upstreams`` (host:port each) as its servers and ``port`` as its listen port.

    Each block of consecutive ``server`` lines (the primaries, the backups) becomes one line per
    upstream with the block's parameters.
    """
    text = SHIPPED.read_text() if shipped is None else shipped
    blocks = list(_SERVER_BLOCK.finditer(text))
    if not blocks or len(_LISTEN_LINE.findall(text)) != 1:
        raise ValueError("the shipped nginx config lost its upstream server lines or its one listen line")

    def one_per_upstream(block: re.Match) -> str:
        first = _SERVER_LINE.match(block.group(0))
        assert first is not None
        indent, params = first.group(1), first.group(2) or ""
        return "".join(f"{indent}server {u}{params};\n" for u in upstreams)

    text = _SERVER_BLOCK.sub(one_per_upstream, text)
    return _LISTEN_LINE.sub(lambda m: f"{m.group(1)}listen 127.0.0.1:{port};", text)


def main_config(tmp: Path) -> str:
    # As root nginx would hand its workers to `nobody`, who cannot enter pytest's private temp
    # dirs; the test keeps them as the invoking user instead. Non-root: the directive is left out.
    user = "user root root;\n" if os.geteuid() == 0 else ""
    temp = "\n".join(f"    {kind}_temp_path {tmp / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""{user}daemon off;
worker_processes 1;
pid {tmp / 'nginx.pid'};
error_log {tmp / 'error.log'} info;
events {{ worker_connections 1024; }}
http {{
    log_format upstreams '$msec $request_time $status "$request" -> $upstream_addr $upstream_status';
    access_log {tmp / 'access.log'} upstreams;
    add_header X-Upstream $upstream_addr always;  # test only: which replica(s) a response came from
{temp}
    include {tmp / 'cosyserve.conf'};
}}
"""


class Nginx:
    def __init__(self, tmp: Path, upstreams: list[str]) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        (tmp / "cosyserve.conf").write_text(render(upstreams, self.port))
        (tmp / "nginx.conf").write_text(main_config(tmp))
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, *extra: str) -> list[str]:
        return [nginx_binary(), "-p", str(self.tmp), "-c", str(self.tmp / "nginx.conf"), "-e",
                str(self.tmp / "error.log"), *extra]

    def check(self) -> None:
        """`nginx -t` on the generated config: raises with nginx's message if it is not valid."""
        r = subprocess.run(self.command("-t"), capture_output=True, text=True, timeout=30, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"nginx -t failed:\n{r.stdout}{r.stderr}")

    def start(self, timeout: float = 20.0) -> Self:
        self.check()
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx not listening after {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: finish open requests, then exit
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log(self) -> str:
        try:
            return (self.tmp / "error.log").read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
