"""The settings' sections: each setting declared, defaulted, validated and commented here, once.

config.yaml lists the user's sections with the same comments for operators; ``dev`` (tests and
benchmarks only) is not in it. The runtime configs below the composition root are built from
these by ``app/settings/runtime.py`` and have no defaults or checks of their own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode

from app.engines.cosyvoice.layout import find_version
from app.settings.keys import check_key, read_keys_file

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cosyserve"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True
    drain_delay_s: float = Field(0.0, ge=0)
    drain_timeout_s: float = Field(30.0, ge=0)
    max_upload_mb: float = Field(20.0, gt=0)
    max_text_chars: int = Field(4096, ge=1)
    body_timeout_s: float = Field(30.0, ge=0)  # 0: no deadline
    max_body_reads: int = Field(64, ge=1)  # request bodies read at once (no permit held meanwhile); beyond: wait
    body_read_wait_s: float = Field(2.0, ge=0)  # ... at most this long for a place, then 503 (0: 503 at once)
    body_buffer_mb: float = Field(256.0, gt=0)  # bytes all bodies being read may hold together; beyond: 503
    send_timeout_s: float = Field(30.0, ge=0)  # a stream whose client reads nothing this long is closed (0: never)
    refusals_per_s: float = Field(20.0, ge=0)  # error answers sent at once per second; beyond, held (0: no pacing)
    max_header_bytes: int = Field(65536, ge=1024, le=16 << 20)  # request line + header fields; beyond: 431
    max_headers: int = Field(100, ge=1, le=10000)  # header fields in one request; beyond: 431
    header_timeout_s: float = Field(10.0, gt=0)  # a request head must arrive in this (from connect or its 1st byte)
    keep_alive_s: float = Field(5.0, gt=0)  # an idle kept-alive connection is closed after this
    heap_trim_interval_s: float = Field(10.0, ge=0)  # give malloc's free pages back to the kernel this often (0: never)
    # NoDecode: an env var is a comma-separated list (or a JSON list), split by _split
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)  # empty (and no file): no keys, every route open
    api_keys_file: str | None = None  # one key per line (KEY, or KEY priority=bulk); blank lines, '#' comments ignored
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)  # origins browsers may call from; ["*"]: any
    _file_keys: dict[str, str | None] = PrivateAttr(default_factory=dict)  # key -> its default class (or None)

    @field_validator("api_keys", "cors_origins", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        """A plain string (an env var) is a comma-separated list."""
        if isinstance(v, str):
            if v.lstrip().startswith("["):
                try:
                    return json.loads(v)
                except ValueError:
                    raise ValueError("not a valid JSON list (or use a comma-separated list)") from None
            return [part.strip() for part in v.split(",") if part.strip()]
        return v

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, v: list[str]) -> list[str]:
        for key in v:
            check_key(key)
        return v

    @model_validator(mode="after")
    def _read_keys_file(self) -> ServerSettings:
        if self.api_keys_file:
            self._file_keys = read_keys_file(self.api_keys_file)
        return self

    @property
    def keys(self) -> frozenset[str]:
        """Every accepted API key: ``api_keys`` and the keys file's lines."""
        return frozenset(self.api_keys) | frozenset(self._file_keys)

    @property
    def key_priorities(self) -> dict[str, str]:
        """The keys file's keys that name a default traffic class (``KEY priority=bulk``)."""
        return {key: p for key, p in self._file_keys.items() if p is not None}


class EngineSettings(_Section):
    model_dir: str | None = None
    cosyvoice_path: str | None = None
    # auto: the first CUDA device if torch can use one, else the CPU; cuda / cuda:N: fail at start without it
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # see app/engines/cosyvoice/precision.py
    dtype_stages: list[Literal["llm", "flow", "hift"]] = ["llm", "flow"]  # what runs in a reduced dtype
    llm_weights: Literal["base", "rl"] = "base"  # base: llm.pt (what upstream loads); rl: llm.rl.pt (Fun-CosyVoice3)
    torch_threads: int = Field(1, ge=1, le=256)
    prompt_cache_size: int = Field(32, ge=0)
    batching: bool = True  # v2/v3: one model instance, LLM continuously batched across requests
    # (resolved by Settings: stays true only for a CosyVoice2/3 dir or the tiny v2/v3 default)
    max_batch_size: int = Field(16, ge=1, le=256)  # most sequences in one batched LLM step
    token2wav_workers: int | None = Field(None, ge=1, le=256)  # batched: flow+HiFT calls at once (None: auto)
    # batched v2 streaming: flow keeps per-request caches, a hop costs its own frames (auto: on for a CPU flow)
    flow_cache: bool | Literal["auto"] = "auto"
    flow_cache_precision: Literal["fp16", "fp32"] = "fp16"  # the caches' keys/values (fp32: exact, twice the memory)
    flow_cache_window_frames: int | None = Field(None, ge=1)  # cap on cached frames per layer (None: exact)
    flow_prompt_cache_mb: float = Field(1024, ge=0)  # flow_cache or token2wav_batch: registered voices' prompt flow state (0: off)
    # all streams' flow caches together; beyond it a stream recomputes (None: a quarter of the memory free at load)
    flow_cache_budget_mb: float | None = Field(None, ge=0)
    llm_quantization: Literal["none", "int8"] = "none"  # int8: dynamic int8 LLM backbone on a CPU (approximate)
    flow_runtime: Literal["auto", "torch", "onnxruntime"] = "auto"  # flow estimator; auto: ORT on a CPU, torch on CUDA
    flow_steps: int | None = Field(None, ge=1, le=100)  # flow ODE steps (None: the model's, 10); changes the audio
    flow_cfg: bool = True  # flow classifier-free guidance; false halves the flow's work and changes the audio
    onnx_cache_dir: str | None = str(DEFAULT_CACHE / "onnx")  # exported ONNX graphs, a dir per weights hash (None: memory)
    # batched v2/v3: every request's flow runs in one thread, in batched rounds (auto: on for CUDA, off on a CPU)
    token2wav_batch: Literal["auto", "on", "off"] = "auto"
    token2wav_max_batch: int | None = Field(None, ge=1, le=256)  # flow calls per round (None: max_batch_size)
    # batched v2/v3: sequences joining at one step prefilled in one forward (auto: on for CUDA, off on a CPU)
    prefill_batch: Literal["auto", "on", "off"] = "auto"
    text_normalization: Literal["auto", "off"] = "auto"  # auto: wetext (zh / en / ja, per sentence) before splitting
    name: str | None = None  # the model's name in /v1/models and answers (None: the model dir's name)

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "fp16" in data:
            raise ValueError("engine.fp16 was removed: write engine.dtype: fp16 instead")
        return data

    @model_validator(mode="after")
    def _token2wav_batch_alone(self) -> EngineSettings:
        if self.token2wav_batch == "on" and self.flow_cache is True:
            raise ValueError("engine.token2wav_batch: on cannot be combined with engine.flow_cache: true (a flow "
                             "round recomputes each hop's prefix; the flow cache keeps per-stream estimator state). "
                             "Choose one; with token2wav_batch: auto the flow cache wins")
        return self

    @field_validator("model_dir", "cosyvoice_path", "onnx_cache_dir")
    @classmethod
    def _expand(cls, v: str | None) -> str | None:
        return os.path.expanduser(v) if v else v


class DevSettings(_Section):
    """Knobs for tests and benchmarks, not for serving (not in config.yaml; docs/install.md#the-dev-section)."""

    fake_engine: bool = False  # a deterministic tone generator instead of CosyVoice (HTTP and cluster tests)
    fake_chunk_delay_s: float = Field(0.0, ge=0, le=60)  # fake engine: sleep before each chunk (latency-bound)
    llm_greedy: bool = False  # argmax instead of CosyVoice's sampling (deterministic output)
    tiny_version: Literal[1, 2, 3] = 2  # no engine.model_dir: which tiny random-weight model is built and served
    tiny_cache_dir: str = str(DEFAULT_CACHE / "models")  # ... and where it is built (once)

    @field_validator("tiny_cache_dir")
    @classmethod
    def _expand(cls, v: str) -> str:
        return os.path.expanduser(v)


def batches_llm(engine: EngineSettings, dev: DevSettings | None = None) -> bool:
    """Whether the engine will batch its LLM: batching on and a CosyVoice2/3 dir (or tiny default)."""
    dev = dev or DevSettings()
    if dev.fake_engine or not engine.batching:
        return False
    if not engine.model_dir:
        return dev.tiny_version >= 2
    root = Path(engine.model_dir).expanduser()
    return (find_version(root) or 0) >= 2


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


class PoolSettings(_Section):
    # None: engine.max_batch_size with LLM batching (v2/v3 dirs), else the CPU count (see Settings)
    workers: int | None = Field(None, ge=1, le=256)
    max_queue: int | None = Field(None, ge=0)  # None: as many as workers (fixed), none (adaptive)
    admission: Literal["adaptive", "fixed"] = "adaptive"  # adaptive: the limit follows measured latency
    admission_budget_s: float | None = Field(None, gt=0)  # adaptive: target latency (None: automatic)
    admission_tolerance: float = Field(2.5, gt=1, le=100)  # adaptive, automatic target: x unloaded latency

    _auto_sized: bool = PrivateAttr(default=False)  # workers and max_queue both left to the defaults

    @property
    def auto_sized(self) -> bool:
        """Neither ``workers`` nor ``max_queue`` was set: the defaults fit the machine (see the lifespan)."""
        return self._auto_sized

    @property
    def queue_limit(self) -> int:
        """Waiting requests allowed: ``max_queue``; unset, one per worker (fixed) or none (adaptive,
        whose limit then moves within the workers: a request it admits starts at once)."""
        if self.max_queue is not None:
            return self.max_queue
        return self.workers if self.admission == "fixed" else 0
    queue_timeout_s: float = Field(30.0, gt=0)
    bulk_max_queue: int = Field(1000, ge=0)  # bulk requests waiting for the room interactive work leaves
    bulk_queue_timeout_s: float = Field(3600.0, gt=0)  # ... each for at most this long (then 503)
    request_timeout_s: float = Field(300.0, ge=0)
    share_engine: bool = False
    compute_nice: int = Field(10, ge=0, le=19)  # compute threads run this much nicer than the event loop (Linux)
    stream_buffer_chunks: int | None = Field(None, ge=1)  # also bound a stream's buffer in chunks (None: bytes only)
    stream_buffer_mb: float = Field(32.0, gt=0)  # unread audio one stream may buffer (the engine waits beyond)
    stream_buffer_total_mb: float = Field(512.0, gt=0)  # unread audio all streams may buffer together
    health_timeout_s: float = Field(5.0, gt=0)
    stuck_grace_s: float = Field(30.0, ge=0)


class VoicesSettings(_Section):
    dir: str = str(DEFAULT_CACHE / "voices")
    max_voices: int = Field(1000, ge=1)
    sync_interval_s: float = Field(0.25, ge=0)  # follow other replicas on a shared dir; 0: do not

    @field_validator("dir")
    @classmethod
    def _expand(cls, v: str) -> str:
        return os.path.expanduser(v)


class CacheSettings(_Section):
    """Answers to reproducible (seeded) requests, sent again without the engine (docs/cache.md)."""

    enabled: bool = True
    memory_mb: float = Field(64.0, ge=0)  # in-memory answers, least recently used out beyond it (0: none)
    dir: str | None = None  # also keep answers in this directory, which replicas may share (None: memory only)
    disk_mb: float = Field(1024.0, gt=0)  # ... within this many MB
    max_entry_mb: float = Field(8.0, gt=0)  # a larger answer is sent, not stored
    derive_seed: bool = False  # an unseeded request gets a seed derived from itself: every repeat is cached
    shared_between_keys: bool = False  # with API keys: one key may get an answer another key's request stored

    @field_validator("dir")
    @classmethod
    def _expand(cls, v: str | None) -> str | None:
        return os.path.expanduser(v) if v else v


class MetricsSettings(_Section):
    enabled: bool = True
    require_key: bool = False  # with API keys on: /metrics needs a key too (else it stays open for scrapers)


class WebSocketSettings(_Section):
    """``WS /v1/audio/speech/stream`` sessions (each utterance's text: server.max_text_chars)."""

    idle_timeout_s: float = Field(30.0, gt=0)  # no client text and no audio produced this long: close
    max_session_chars: int = Field(100_000, ge=1)  # text one session may send in all
    max_sessions: int = Field(64, ge=1)  # open sessions at once; beyond: error + close 1013 (no synthesis permit)
    max_session_s: float = Field(3600.0, gt=0)  # a session's whole life; then error session_expired + close
    max_message_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024)  # one client message; bigger: invalid_message


class WyomingSettings(_Section):
    """Home Assistant's Wyoming protocol: a TTS service on its own TCP port (docs/home-assistant.md).

    Wyoming has no authentication: off unless ``port`` is set, bound to ``server.host`` unless ``host``
    says otherwise. Each utterance's text: server.max_text_chars; idle timeout, session lifetime and text
    per connection: the ``websocket`` section's.
    """

    port: int | None = Field(None, ge=0, le=65535)  # None: no Wyoming service
    host: str | None = None  # None: server.host
    max_sessions: int = Field(16, ge=1)  # open connections at once; beyond: an error event, then closed
    priority: Literal["interactive", "bulk"] = "interactive"  # the traffic class of every Wyoming utterance
    samples_per_chunk: int = Field(1024, ge=64, le=65536)  # most samples in one audio-chunk event
    max_event_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024)  # one event's header, data and payload
