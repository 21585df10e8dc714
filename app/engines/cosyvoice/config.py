"""``CosyVoiceConfig``: what one CosyVoice engine is configured with, mapped from settings once."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class CosyVoiceConfig:
    model_dir: str
    cosyvoice_path: str | None = None
    dtype: str = "fp32"  # engine.dtype: auto | fp32 | bf16 | fp16 (app/engines/cosyvoice/precision.py)
    dtype_stages: tuple[str, ...] = ("llm", "flow")  # which stages run in a reduced dtype
    torch_threads: int = 1
    prompt_cache_size: int = 32
    max_segment_chars: int = 240
    max_segment_tokens: int = 80  # text tokens per LLM call, as upstream's frontend splits (token_max_n)
    text_normalization: str = "auto"  # auto: wetext for zh / en / ja, per sentence; off
    batching: bool = False  # v2/v3: the LLM runs in a shared continuous-batching scheduler
    max_batch_size: int = 16
    llm_greedy: bool = False  # testing only: argmax sampling
    token2wav_workers: int | None = None  # batched: token2wav calls at once; None: CPU cores (CPU), no limit (GPU)
    flow_cache: bool = False  # batched streaming: flow computes each hop's new frames only (flow_cache.py)
    flow_cache_window_frames: int | None = None  # keep at most this many cached frames per layer (inexact)
    flow_prompt_cache_mb: float = 0  # flow_cache or token2wav_batch: voices' prompt flow state, LRU by bytes (0: off)
    token2wav_batch: str = "auto"  # auto | on | off: every request's flow in one thread, batched rounds (auto: CUDA)
    token2wav_max_batch: int | None = None  # calls per flow round (None: max_batch_size)

    @classmethod
    def from_settings(cls, engine: Any, model_dir: str) -> CosyVoiceConfig:
        """The engine settings (``app.config.EngineSettings``) as a config: every field of the same name.

        ``engine.batching`` is already resolved by the settings (on only for a CosyVoice2/3 dir).
        """
        values = {f.name: getattr(engine, f.name) for f in fields(cls) if f.name != "model_dir" and hasattr(engine, f.name)}
        values["dtype_stages"] = tuple(values.get("dtype_stages", cls.dtype_stages))
        return cls(model_dir=model_dir, **values)
