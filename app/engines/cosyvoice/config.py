"""``CosyVoiceConfig``: what one CosyVoice engine is configured with, mapped from settings once."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class CosyVoiceConfig:
    model_dir: str
    cosyvoice_path: str | None = None
    device: str = "auto"  # engine.device: auto | cpu | cuda | cuda:N (app/engines/cosyvoice/device.py)
    dtype: str = "fp32"  # engine.dtype: auto | fp32 | bf16 | fp16 (app/engines/cosyvoice/precision.py)
    dtype_stages: tuple[str, ...] = ("llm", "flow")  # which stages run in a reduced dtype
    llm_weights: str = "base"  # engine.llm_weights: base (llm.pt) | rl (llm.rl.pt), layout.LLM_WEIGHTS
    torch_threads: int = 1
    prompt_cache_size: int = 32
    max_segment_chars: int = 240
    max_segment_tokens: int = 80  # text tokens per LLM call, as upstream's frontend splits (token_max_n)
    text_normalization: str = "auto"  # auto: wetext for zh / en / ja, per sentence; off
    batching: bool = False  # v2/v3: the LLM runs in a shared continuous-batching scheduler
    max_batch_size: int = 16
    llm_greedy: bool = False  # testing only: argmax sampling
    token2wav_workers: int | None = None  # batched: token2wav calls at once; None: CPU cores (CPU), no limit (GPU)
    flow_cache: bool = False  # batched streaming: flow computes each hop's new frames only (flow/cache.py)
    flow_cache_window_frames: int | None = None  # keep at most this many cached frames per layer (inexact)
    flow_prompt_cache_mb: float = 0  # flow_cache or token2wav_batch: voices' prompt flow state, LRU by bytes (0: off)
    flow_cache_budget_mb: float | None = None  # with flow_cache: all streams' caches together (None: no limit)
    llm_quantization: str = "none"  # none | int8: dynamic int8 Qwen2 backbone on a CPU (quantize.py)
    flow_runtime: str = "torch"  # auto | torch | onnxruntime: what runs the flow estimator (flow/solver.py)
    flow_steps: int | None = None  # the flow ODE's Euler steps (None: the model's, 10); fewer changes the audio
    flow_cfg: bool = True  # classifier-free guidance in the flow; false halves its work and changes the audio
    onnx_cache_dir: str | None = None  # where exported ONNX graphs are kept, keyed by weights (None: memory only)
    token2wav_batch: str = "auto"  # auto | on | off: every request's flow in one thread, batched rounds (auto: CUDA)
    token2wav_max_batch: int | None = None  # calls per flow round (None: max_batch_size)
    prefill_batch: str = "auto"  # auto | on | off: joiners of one step in one prefill forward (auto: CUDA)

    def levers(self) -> Any:
        """The cost levers as ``load_model_dir`` takes them."""
        from app.engines.cosyvoice.levers import Levers

        return Levers(llm_quantization=self.llm_quantization, flow_runtime=self.flow_runtime,
                      flow_steps=self.flow_steps, flow_cfg=self.flow_cfg, onnx_cache_dir=self.onnx_cache_dir,
                      threads=max(1, int(self.torch_threads)))

    @classmethod
    def from_settings(cls, engine: Any, model_dir: str) -> CosyVoiceConfig:
        """The engine settings (``app.config.EngineSettings``) as a config: every field of the same name.

        ``engine.batching`` is already resolved by the settings (on only for a CosyVoice2/3 dir).
        """
        values = {f.name: getattr(engine, f.name) for f in fields(cls) if f.name != "model_dir" and hasattr(engine, f.name)}
        values["dtype_stages"] = tuple(values.get("dtype_stages", cls.dtype_stages))
        return cls(model_dir=model_dir, **values)
