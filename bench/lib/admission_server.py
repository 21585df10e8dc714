"""The admission, abuse and priority suites' server (``pool_server``), request (``work``: one sentence, streamed
PCM) and admission gauges (``gauges``, ``Poller``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx

from bench.lib import prom
from bench.lib.load import RequestSpec
from bench.lib.procs import ServerProc

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
GAUGES = {"limit": "tts_admission_limit", "load": "tts_admission_load",
          "predicted_wait_s": "tts_admission_predicted_wait_seconds", "in_flight": "tts_inflight_requests",
          "target_s": "tts_admission_target_latency_seconds"}


def pool_server(name: str, pool: dict[str, Any], nice: int, model_dir: str, run_dir: Path) -> ServerProc:
    """A ``cosyserve serve`` subprocess with ``pool`` as its pool section (none: the defaults), at ``nice``."""
    config: dict[str, Any] = {
        "server": {"log_level": "info", "access_log": True, "drain_timeout_s": 5},  # 503s timed server-side too
        "engine": {"model_dir": model_dir},
        "voices": {"dir": str(run_dir / "voices")},
    }
    if pool:
        config["pool"] = pool
    return ServerProc(name, config, run_dir, nice=nice)


def work(priority: str | None = None) -> RequestSpec:
    """The request; ``priority``: with that class (the priority suite's bulk)."""
    extra = {"priority": priority} if priority is not None else {}
    return RequestSpec("POST", "/v1/tts", json={"text": TEXT, "format": "pcm", "stream": True, **extra})


async def gauges(client: httpx.AsyncClient) -> dict[str, float | None]:
    samples = await prom.ascrape(client)
    return {k: samples.get(name) for k, name in GAUGES.items()}


class Poller:
    """Reads the admission gauges every ``every_s`` into ``series`` (seconds since ``t0``)."""

    def __init__(self, url: str, t0: float, every_s: float = 0.5) -> None:
        self.url, self.t0, self.every_s = url, t0, every_s
        self.series: list[dict[str, Any]] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        async with httpx.AsyncClient(base_url=self.url) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    self.series.append({"t": round(time.monotonic() - self.t0, 2), **await gauges(client)})
                await asyncio.sleep(self.every_s)

    @property
    def limits(self) -> list[float]:
        """The admission limit at each reading that had one."""
        return [g["limit"] for g in self.series if g.get("limit") is not None]

    def __enter__(self) -> Poller:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
