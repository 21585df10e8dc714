"""A real `cosyserve serve` subprocess for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from signal import SIGTERM

import httpx
import yaml

from tests.support.paths import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_engine_config(tmp: Path, **pool: object) -> dict:
    """A ``cosyserve serve`` config on the fake engine, for e2e tests of the HTTP layer and its clients:
    2 workers, a queue of 8, quiet logs, a short drain, voices under ``tmp``; ``pool`` overrides."""
    return {
        "dev": {"fake_engine": True},
        "pool": {"workers": 2, "max_queue": 8, "request_timeout_s": 30, **pool},
        "server": {"log_level": "warning", "drain_timeout_s": 5},
        "voices": {"dir": str(tmp / "voices")},
    }


class ServerProcess:
    """Start ``cosyserve serve`` with a config dict; wait until ready; stop with a signal."""

    def __init__(self, tmp: Path, config: dict, env: dict | None = None) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.config_path = tmp / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = tmp / f"server-{self.port}.log"
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> ServerProcess:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--config", str(self.config_path), "--host", "127.0.0.1",
             "--port", str(self.port)],
            cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, sig: int = SIGTERM, timeout: float = 60.0) -> int | None:  # `signal` is a method here
        if self.proc is None:
            return None
        try:
            if self.proc.poll() is not None:  # it exited on its own (or a test signalled and waited)
                return self.proc.returncode
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(10)
        finally:
            self._log.close()  # on every path: an exited server's log was left open

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
