"""Does bf16 pay on this CPU? One full-size Linear and one Conv1d, fp32 vs bf16 weights, 1 thread.

    python -m bench.studies.2026-12-01-bf16-ops.bf16_ops

Shapes: the Qwen2.5-0.5B MLP up-projection (896 -> 4864) over 200 rows, and a 256-channel
kernel-3 Conv1d over 2000 frames (a flow-estimator-sized convolution). Prints ms per
call and the bf16/fp32 ratio, and whether oneDNN reports native bf16.
"""

from __future__ import annotations

import json
import time


def _ms(fn, x, reps: int) -> float:
    for _ in range(3):
        fn(x)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(x)
    return (time.perf_counter() - t0) / reps * 1000


def main() -> int:
    import torch

    from app.engines.cosyvoice.precision import cpu_has_native_bf16

    torch.set_num_threads(1)
    out = {"native_bf16": cpu_has_native_bf16(), "threads": 1}
    with torch.inference_mode():
        for name, make, shape, reps in (("linear_896x4864_200rows", lambda: torch.nn.Linear(896, 4864), (200, 896), 20),
                                        ("conv1d_256ch_k3_2000frames", lambda: torch.nn.Conv1d(256, 256, 3, padding=1),
                                         (1, 256, 2000), 10)):
            res = {}
            for dt, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
                mod = make().to(dt)
                res[label] = round(_ms(mod, torch.randn(*shape).to(dt), reps), 2)
            res["bf16_over_fp32"] = round(res["bf16"] / res["fp32"], 2)
            out[name] = res
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
