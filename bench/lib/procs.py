"""What every suite shares: its options, run folder and printer, and its server (``ServerProc``: the tests'
``ServerProcess`` with its RSS sampled; leaving its ``with`` block kills its whole process group)."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import psutil

from tests.support.server import ServerProcess

ROOT = Path(__file__).resolve().parents[2]

# One intra-op thread per engine everywhere; the benchmark compares serving designs, not BLAS settings.
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def results_dir(suite: str, quick: bool = False) -> Path:
    """Where a suite writes its results unless told: .cache/bench/SUITE[/quick] (git-ignored; bench/README.md)."""
    return ROOT / ".cache" / "bench" / suite / ("quick" if quick else "")


class SuiteParser(argparse.ArgumentParser):
    """A server suite's parser, with the options every one takes (``quick``: the help of its ``--quick``;
    ``realtime``: ``--client-rt-priority``; ``server``: ``--model-dir`` and ``--timeout-s``)."""

    def __init__(self, doc: str | None, suite: str, quick: str | None = None, realtime: bool = False,
                 server: bool = True) -> None:
        super().__init__(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        self.suite = suite
        if quick:
            self.add_argument("--quick", action="store_true", help=quick)
        if realtime:
            self.add_argument("--client-rt-priority", type=int, default=1,
                              help="the load generator in SCHED_FIFO at this priority where permitted "
                                   "(bench/lib/sched.py; 0: off)")
        where = f".cache/bench/{suite}" + (f"; --quick: .cache/bench/{suite}/quick" if quick else "")
        self.add_argument("--out", help=f"output dir (default {where})")
        if server:
            self.add_argument("--model-dir", help="default: the tiny CosyVoice2 model of bench/lib/model.py")
            self.add_argument("--timeout-s", type=float, default=120.0, help="client timeout per request")

    def parse(self, argv: list[str] | None, quick: dict | None = None, full: dict | None = None) -> argparse.Namespace:
        """The options: those left None take ``quick``'s or ``full``'s value, ``--out`` the suite's folder."""
        args = self.parse_args(argv)
        is_quick = getattr(args, "quick", False)
        for key, default in ((quick if is_quick else full) or {}).items():
            if getattr(args, key) is None:
                setattr(args, key, default)
        args.out = Path(args.out) if args.out else results_dir(self.suite, is_quick)
        return args


def tiny_config(tmp: str | Path, **sections: Any) -> dict[str, Any]:
    """A ``cosyserve`` config on the tiny CosyVoice2 (built once into .cache/models), voices under ``tmp``, no access
    log; ``sections`` added or replaced."""
    return {"server": {"access_log": False}, "voices": {"dir": str(Path(tmp) / "voices")},
            "dev": {"tiny_version": 2, "tiny_cache_dir": str(ROOT / ".cache" / "models")}, **sections}


def machine() -> str:
    return f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}."


def logger(name: str) -> Callable[[str], None]:
    """A suite's progress printer: ``[NAME HH:MM:SS] message``."""
    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", flush=True)
    return log


def shown(path: str | Path | None) -> str | None:
    """A path as the report may name it: relative to the repository, or only its name (no machine's paths)."""
    if path is None:
        return None
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else resolved.name


def start_run(name: str, args: Any, log: Callable[[str], None], **fields: Any) -> tuple[Path, dict[str, Any]]:
    """A run's folder for server logs and configs (.bench/NAME-YYYYmmdd-HHMMSS, git-ignored) and its results'
    header: the options (paths as ``shown``), the start, the cores and the load average (a warning if not idle)."""
    run_dir, load1 = ROOT / ".bench" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}", os.getloadavg()[0]
    run_dir.mkdir(parents=True, exist_ok=True)
    log(f"out {shown(args.out)}; logs {shown(run_dir)}; {os.cpu_count()} cores; load average {load1:.2f}")
    if load1 > 0.5:
        log("WARNING: the machine is not idle; other work running now skews every number")
    config = {k: shown(v) if k in ("out", "model_dir") or isinstance(v, Path) else v for k, v in vars(args).items()}
    return run_dir, {"config": config, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cores": os.cpu_count(),
                     "loadavg_start": os.getloadavg(), **fields}


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants (0 once it is gone)."""
    total = 0
    with contextlib.suppress(psutil.Error):
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
    return total


class RssSampler:
    """Samples a process tree's RSS every 0.25 s in a daemon thread; past ``limit_bytes`` it kills the tree's
    process group once (a guard for the machine) and sets ``limit_hit``."""

    def __init__(self, pid: int, limit_bytes: int = 0) -> None:
        self._proc, self._pid, self._limit, self.limit_hit = psutil.Process(pid), pid, limit_bytes, False
        self._stop, self._t0 = threading.Event(), time.monotonic()
        self.samples: list[tuple[float, int]] = []
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def now(self) -> int:
        return tree_rss(self._proc)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = tree_rss(self._proc)
            if rss:
                self.samples.append((time.monotonic() - self._t0, rss))
            if self._limit and rss > self._limit and not self.limit_hit:
                self.limit_hit = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._pid, signal.SIGKILL)  # our own child's group (start_new_session)
            self._stop.wait(0.25)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def peak(self, since_s: float = 0.0) -> int:
        return max((r for t, r in self.samples if t >= since_s), default=0)

    def elapsed(self) -> float:
        return time.monotonic() - self._t0


class ServerProc(ServerProcess):
    """A suite's server: ``ServerProcess`` (tests/support/server.py) with ``THREAD_ENV``, at ``nice``, its process
    tree's RSS sampled from ready to stop (``rss``; past ``rss_limit_bytes`` it is killed)."""

    def __init__(self, name: str, config: dict, run_dir: Path, *, nice: int = 0, rss_limit_bytes: int = 0) -> None:
        prefix = ["nice", "-n", str(nice)] if nice > 0 and shutil.which("nice") else []
        super().__init__(run_dir, config, THREAD_ENV, name=name, prefix=prefix)
        self.rss_limit_bytes, self.rss = rss_limit_bytes, None

    def start(self, timeout: float = 300.0) -> Self:
        super().start(timeout)
        self.rss = RssSampler(self.proc.pid, limit_bytes=self.rss_limit_bytes)
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        if self.rss is not None:
            self.rss.stop()
        return super().stop(sig, timeout)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
