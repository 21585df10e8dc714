"""The flow estimator and HiFT on ONNX Runtime against eager torch, and ORT's thread count under concurrency.

    python -m bench.studies.2026-12-01-onnx-cpu.onnx_cpu --model-dir .cache/full2          # full-size v2 (~3 min on 2 cores)

One process. Reported (milliseconds, median of ``--repeats``):

* one estimator pass (2 CFG rows x 280 frames, whole and chunk-masked) in eager torch and on
  ONNX Runtime (our export, ``flow/onnx.py``), 1 thread each, and their largest difference;
* throughput with two passes at once (two slot threads, as the token2wav gate allows on 2 cores):
  one shared session with 1 intra-op thread vs with 2, and eager torch with 1 thread per caller;
* the export's time and size, and the RSS one session adds;
* HiFT's convolution stacks (everything between its STFT and ISTFT; the rest stays torch either
  way) for 175 mel frames (3.5 s of audio), eager vs ONNX Runtime.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import threading
import time
import warnings
from pathlib import Path
from typing import Any


def _median_ms(fn: Any, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _two_at_once_ms(fn: Any, repeats: int) -> float:
    """Wall ms per pass with two threads each running ``repeats`` passes."""
    fn()
    threads = [threading.Thread(target=lambda: [fn() for _ in range(repeats)]) for _ in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 1000 * (time.perf_counter() - t0) / (2 * repeats)


def hift_convs(hift: Any) -> Any:
    """HiFT's network between its STFT and ISTFT as one module (mel, source STFT -> magnitude/phase logits)."""
    import torch
    import torch.nn.functional as F

    class Convs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.h = hift

        def forward(self, x: Any, s_stft: Any) -> Any:
            h = self.h
            x = h.conv_pre(x)
            for i in range(h.num_upsamples):
                x = h.ups[i](F.leaky_relu(x, h.lrelu_slope))
                if i == h.num_upsamples - 1:
                    x = h.reflection_pad(x)
                x = x + h.source_resblocks[i](h.source_downs[i](s_stft))
                xs = sum(h.resblocks[i * h.num_kernels + j](x) for j in range(h.num_kernels))
                x = xs / h.num_kernels
            return h.conv_post(F.leaky_relu(x))

    return Convs()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--frames", type=int, default=280)
    args = ap.parse_args(argv)

    import numpy as np
    import psutil
    import torch

    from app.engines.cosyvoice.flow.onnx import OnnxEstimator, _dummy, _session, export
    from app.engines.cosyvoice.load import load_model_dir

    torch.set_num_threads(1)
    model = load_model_dir(args.model_dir).model
    est = model.flow.decoder.estimator
    buf = io.BytesIO()
    t0 = time.perf_counter()
    export(est, buf)
    export_s = time.perf_counter() - t0
    graph = buf.getvalue()
    rss0 = psutil.Process().memory_info().rss
    first = _session(graph, 1)
    rss_mb = (psutil.Process().memory_info().rss - rss0) / 2**20
    sessions = {1: first, 2: _session(graph, 2)}
    sessions = {n: OnnxEstimator(s, chunk=int(est.static_chunk_size), source="memory", chunked=True, batch=None)
                for n, s in sessions.items()}
    inputs = _dummy(est, 2, args.frames, seed=0)
    out: dict = {"model_dir": Path(args.model_dir).name, "frames": args.frames, "export_s": export_s,
                 "graph_mb": len(graph) / 2**20, "session_rss_mb": rss_mb}
    with torch.inference_mode():
        for streaming in (False, True):
            ref = est(*inputs, streaming=streaming)
            got = sessions[1](*inputs, streaming=streaming)
            key = "chunked" if streaming else "whole"
            out[f"estimator_{key}"] = {
                "eager_ms": _median_ms(lambda s=streaming: est(*inputs, streaming=s), args.repeats),
                "ort_ms": _median_ms(lambda s=streaming: sessions[1](*inputs, streaming=s), args.repeats),
                "max_abs_diff": float((got - ref).abs().max()), "scale": float(ref.abs().max())}
        out["two_at_once_ms_per_pass"] = {
            "eager_1_thread_each": _two_at_once_ms(lambda: est(*inputs, streaming=False), args.repeats),
            "ort_session_1_thread": _two_at_once_ms(lambda: sessions[1](*inputs), args.repeats),
            "ort_session_2_threads": _two_at_once_ms(lambda: sessions[2](*inputs), args.repeats)}
        out["one_alone_ort_2_threads_ms"] = _median_ms(lambda: sessions[2](*inputs), args.repeats)
        hift = model.hift
        mel = torch.randn(1, 80, 175, generator=torch.Generator().manual_seed(1))
        _, source = hift.inference(speech_feat=mel)
        re, im = hift._stft(source.squeeze(1))
        s_stft = torch.cat([re, im], dim=1)
        convs = hift_convs(hift)
        want = convs(mel, s_stft)
        hbuf = io.BytesIO()
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(convs, (mel, s_stft), hbuf, dynamo=False, opset_version=18, input_names=["x", "s"],
                              output_names=["y"], dynamic_axes={"x": {2: "t"}, "s": {2: "ts"}, "y": {2: "ty"}})
        hsess = _session(hbuf.getvalue(), 1)
        feed = {"x": mel.numpy(), "s": s_stft.numpy()}
        got = hsess.run(None, feed)[0]
        out["hift"] = {"inference_eager_ms": _median_ms(lambda: hift.inference(speech_feat=mel), args.repeats),
                       "convs_eager_ms": _median_ms(lambda: convs(mel, s_stft), args.repeats),
                       "convs_ort_ms": _median_ms(lambda: hsess.run(None, feed), args.repeats),
                       "max_abs_diff": float(np.abs(got - want.numpy()).max())}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
