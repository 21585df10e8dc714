"""The HTTP systems under test: how to start each one, and the requests each one gets.

Every system serves the same tiny model with the same engine code, one torch
thread per engine, on loopback. The work per request is identical: one sentence
in CosyVoice's non-streaming mode, preset speaker, raw 16-bit PCM back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.lib.load import RequestSpec
from bench.lib.procs import ServerProc, cosyserve, free_port, python_module


@dataclass(frozen=True)
class System:
    key: str  # short id used in files and tables
    label: str
    work: RequestSpec  # the request every throughput point sends
    short: RequestSpec  # a short text (memory run)
    stream: RequestSpec | None  # a streamed request (time to first audio), where the system streams

    def server(self, model_dir: str, run_dir: Path, workers: int | None = None, max_queue: int | None = None,
               rss_limit: int = 0) -> ServerProc:
        """``workers`` / ``max_queue``: cosyserve's pool settings, None (the default) leaves them to the server,
        so the benchmark measures the server as a user starts it."""
        if self.key == "cosyserve":
            pool = {k: v for k, v in (("workers", workers), ("max_queue", max_queue)) if v is not None}
            config = {
                "server": {"log_level": "warning", "drain_timeout_s": 10},
                "engine": {"model_dir": model_dir, "torch_threads": 1},
                "voices": {"dir": str(run_dir / "voices")},
                "metrics": {"enabled": True},
            }
            if pool:
                config["pool"] = pool
            return cosyserve(self.key, config, run_dir, rss_limit_bytes=rss_limit)
        port = free_port()
        module = {"upstream": "bench.baselines.upstream_pattern", "per_request": "bench.baselines.load_per_request"}
        argv = python_module(module[self.key], "--model-dir", model_dir, "--port", str(port), "--torch-threads", "1")
        return ServerProc(self.key, argv, port, "/health", run_dir, rss_limit_bytes=rss_limit)


def native(text: str, stream: bool = False) -> RequestSpec:
    body = {"text": text, "format": "pcm"}
    if stream:
        body["stream"] = True
    return RequestSpec("POST", "/v1/tts", json=body)


def upstream_form(text: str, speaker: str) -> RequestSpec:
    return RequestSpec("POST", "/inference_sft", data={"tts_text": text, "spk_id": speaker})


def systems(text: str, short_text: str, speaker: str) -> dict[str, System]:
    return {
        "cosyserve": System("cosyserve", "(b) cosyserve", native(text), native(short_text), native(text, stream=True)),
        "upstream": System("upstream", "(d) upstream pattern", upstream_form(text, speaker),
                           upstream_form(short_text, speaker), None),
        "per_request": System("per_request", "(c) load per request", native(text), native(short_text),
                              native(text, stream=True)),
    }
