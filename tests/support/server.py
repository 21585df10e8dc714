"""A real ``cosyserve serve`` subprocess, for end-to-end tests and the benchmarks (bench/lib/procs.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from signal import SIGTERM
from typing import Self

import httpx
import yaml

from tests.support.paths import ROOT

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
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
    """``cosyserve serve`` with a config dict (written to TMP/NAME.yaml, its log TMP/NAME-PORT.log) on a free
    loopback port, in its own process group; ready once /health/ready answers 200. ``stop`` signals it and
    waits, then SIGKILLs its group (nothing it started outlives it); leaving ``with`` stops it. ``prefix``: the
    command line before Python's (``nice -n 5``: nice execs the server, so its pid is the server's)."""

    def __init__(self, tmp: Path, config: dict, env: dict | None = None, *, name: str = "server",
                 prefix: Sequence[str] = ()) -> None:
        self.port, self.tmp, self.name = free_port(), tmp, name
        tmp.mkdir(parents=True, exist_ok=True)
        self.config_path = tmp / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = tmp / f"{name}-{self.port}.log"
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.argv = [*prefix, sys.executable, "-m", "app.cli", "serve", "--config", str(self.config_path),
                     "--host", HOST, "--port", str(self.port)]
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 180.0) -> Self:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.base_url + "/health/ready", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log()}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, sig: int = SIGTERM, timeout: float = 60.0) -> int | None:  # `signal` is a method here
        """``sig``, up to ``timeout`` s for the server to exit, then SIGKILL to its group; its exit code.
        Idempotent; a server that exited on its own (or was signalled and waited for) keeps its code."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # anything left in its group goes too
            os.killpg(self.proc.pid, signal.SIGKILL)
        if code is None:
            code = self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def log(self, n: int = 20000) -> str:
        """The last ``n`` characters of its log."""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
