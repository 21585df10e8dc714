"""What the flow cache's precision and runtime cost in accuracy (issue 48): mel and audio against the exact path.

    python -m tests.support.flow_cache_error [--model-dir .cache/full2] [--tokens 86]

1. Mel: one stream's hops (fixed 25-token hops after a 50-token prompt, the last one final) through
   ``flow.inference`` recomputing the prefix (CosyVoice's own way), then with a FlowStream on the torch
   hooks and on the ONNX stream graph, in fp32 and fp16 caches: the largest and mean difference to the
   recomputing mel, relative to its largest magnitude; bytes held at the end; seconds.
2. Audio: an engine on the server's defaults (flow cache on) streams one seeded request; the same with
   ``flow_cache_precision: fp32`` and with the flow cache off (CosyVoice's recomputing hops): the
   correlation and largest difference of the PCM (HiFT's excitation noise is seeded per request).
   The final hop is chunk-masked with the cache and fully attended without it, so the comparison with
   the cache off covers the hops before the last.
"""

from __future__ import annotations

import argparse
import threading
import time


def mel_errors(model_dir: str, n_tokens: int) -> list[str]:
    import torch

    from app.engines.cosyvoice.flow import cache as flow_cache
    from app.engines.cosyvoice.flow.onnx_stream import load_stream_estimator
    from app.engines.cosyvoice.load import load_model_dir
    from tests.support.flow_streams import inputs, streamed_mel

    flow = load_model_dir(model_dir, dtype="fp32").model.flow
    flow_cache.install(flow)
    x = inputs(n_tokens=n_tokens)

    def stream(state: flow_cache.FlowStream | None) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        mel, _ = streamed_mel(flow, x, state)
        return mel, time.perf_counter() - t0

    ref, seconds = stream(None)
    scale = float(ref.abs().max())
    lines = [f"recomputing: {seconds:.1f} s (mel scale {scale:.2f})"]
    for storage, dtype in (("fp32", None), ("fp16", torch.float16)):
        graph = load_stream_estimator(flow.decoder.estimator, cache_dir=None, storage=storage)
        for runtime in ("torch", "onnxruntime"):
            state = flow_cache.FlowStream(kv_dtype=dtype, runtime=graph if runtime == "onnxruntime" else None)
            mel, seconds = stream(state)
            diff = (mel - ref).abs()
            lines.append(f"{storage} caches on {runtime}: {seconds:.1f} s, largest {float(diff.max()) / scale:.1e} "
                         f"mean {float(diff.mean()) / scale:.1e} of the scale, {state.nbytes() / 2**20:.0f} MiB held")
    return lines


def audio_errors(model_dir: str) -> list[str]:
    import numpy as np
    import torch

    from app.engines.base import SynthesisRequest
    from app.engines.cosyvoice.engine import CosyVoiceEngine
    from app.settings.runtime import engine_config_of, server_engine
    from tests.support.flow_streams import STREAM_TEXT

    pcm = {}
    for name, over in (("defaults", {}), ("fp32 caches", {"flow_cache_precision": "fp32"}),
                       ("cache off", {"flow_cache": False})):
        eng = CosyVoiceEngine(engine_config_of(model_dir, batching=True, text_normalization="off",
                                               **server_engine(**over)))
        eng.load()
        req = SynthesisRequest(text=STREAM_TEXT, mode="sft", speaker=eng.voices()[0], stream=True, seed=7)
        t0 = time.perf_counter()
        pcm[name] = [c.pcm.astype(np.float64) for c in eng.synthesize(req, threading.Event())]
        print(f"  {name}: {len(pcm[name])} chunks in {time.perf_counter() - t0:.1f} s", flush=True)
        eng.close()
        torch.manual_seed(0)
    lines = []
    base = pcm["defaults"]
    for name in ("fp32 caches", "cache off"):
        other = pcm[name]
        upto = -1 if name == "cache off" else None  # the last hop: chunk-masked vs full attention
        a, b = np.concatenate(base[:upto]), np.concatenate(other[:upto])
        if a.shape != b.shape:
            lines.append(f"defaults vs {name}: different lengths {a.shape} vs {b.shape}")
            continue
        lines.append(f"defaults vs {name}{' (hops before the last)' if upto else ''}: correlation "
                     f"{np.corrcoef(a, b)[0, 1]:.6f}, largest difference {np.abs(a - b).max():.0f} of int16, "
                     f"rms {np.sqrt(np.mean((a - b) ** 2)):.1f} (signal rms {np.sqrt(np.mean(b ** 2)):.0f})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=None, help="a CosyVoice2 dir (default: the tiny test model)")
    ap.add_argument("--tokens", type=int, default=86, help="speech tokens of the mel comparison's stream")
    args = ap.parse_args()
    import torch

    from app.devmodels.tiny import ensure_tiny_model
    from tests.support.paths import CACHE

    torch.set_num_threads(1)
    model_dir = args.model_dir or str(ensure_tiny_model(CACHE, 2))
    for line in [*mel_errors(model_dir, args.tokens), *audio_errors(model_dir)]:
        print(line, flush=True)


if __name__ == "__main__":
    main()
