"""``CosyVoiceConfig``: what one CosyVoice engine runs with, built from ``Settings.engine`` by
``app/settings/runtime.py`` (its defaults and checks are the settings'; none here)."""

from __future__ import annotations

from dataclasses import dataclass

from app.engines.cosyvoice.levers import Levers

MAX_SEGMENT_CHARS = 240  # a sentence piece's characters before the token budget splits it further
MAX_SEGMENT_TOKENS = 80  # text tokens per LLM call, as upstream's frontend splits (token_max_n)


@dataclass
class CosyVoiceConfig:
    model_dir: str
    cosyvoice_path: str | None  # an upstream checkout to import instead of the installed package
    device: str  # auto | cpu | cuda | cuda:N (app/engines/cosyvoice/device.py)
    dtype: str  # auto | fp32 | bf16 | fp16 (app/engines/cosyvoice/precision.py)
    dtype_stages: tuple[str, ...]  # which stages run in a reduced dtype
    llm_weights: str  # base (llm.pt) | rl (llm.rl.pt), layout.LLM_WEIGHTS
    torch_threads: int
    prompt_cache_size: int
    max_segment_chars: int
    max_segment_tokens: int
    text_normalization: str  # auto: wetext for zh / en / ja, per sentence; off
    batching: bool  # v2/v3: the LLM runs in a shared continuous-batching scheduler (resolved by the settings)
    max_batch_size: int
    llm_greedy: bool  # tests: argmax sampling
    token2wav_workers: int | None  # batched: token2wav calls at once; None: CPU cores (CPU), no limit (GPU)
    flow_cache: bool | str  # batched streaming: flow computes each hop's new frames only (flow/cache.py); "auto"
    flow_cache_precision: str  # fp16 | fp32: the flow cache's stored keys/values
    flow_cache_window_frames: int | None  # keep at most this many cached frames per layer (inexact)
    flow_prompt_cache_mb: float  # flow_cache or token2wav_batch: voices' prompt flow state, LRU by bytes (0: off)
    flow_cache_budget_mb: float | None  # with flow_cache: all streams' caches together (None: sized at load)
    levers: Levers  # the cost levers: int8 LLM, flow runtime, ODE steps, CFG (levers.py)
    token2wav_batch: str  # auto | on | off: every request's flow in one thread, batched rounds (auto: CUDA)
    token2wav_max_batch: int | None  # calls per flow round (None: max_batch_size)
    prefill_batch: str  # auto | on | off: joiners of one step in one prefill forward (auto: CUDA)
