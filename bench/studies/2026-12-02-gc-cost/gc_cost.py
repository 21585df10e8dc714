"""What the garbage collector costs a server with a loaded model (app/gcpolicy.py).

    python -m bench.studies.2026-12-02-gc-cost.gc_cost [--model-dir DIR] [--repeats 3]

Each measurement in a fresh process (``--one``): build, load and warm up one engine as the
server does (the tiny v2 default unless ``--model-dir``), with automatic collection on as
before or paused as the lifespan now does; then time full collections of the loaded heap,
before and after ``gc.freeze()``. A full collection holds the GIL: the event loop and the
synthesis threads wait for it. Prints one line per process and the medians.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time


def one(model_dir: str | None, paused: bool) -> dict[str, float]:
    from app import gcpolicy
    from app.lifespan import engine_factory
    from app.settings import Settings

    overrides = {"engine": {"model_dir": model_dir}} if model_dir else {}
    settings = Settings(**overrides)
    factory = engine_factory(settings)
    passes: list[dict] = []
    gc.callbacks.append(lambda phase, info: passes.append(info) if phase == "stop" else None)
    t0 = time.perf_counter()
    if paused:
        with gcpolicy.paused():
            engine = factory(0)
            engine.load()
            engine.warmup()
            objects = len(gc.get_objects())
            first = time.perf_counter()
            gc.collect()  # the lifespan's one pass before the freeze (while still paused)
            first_ms = (time.perf_counter() - first) * 1000
    else:
        engine = factory(0)
        engine.load()
        engine.warmup()
        objects, first_ms = len(gc.get_objects()), 0.0
    load_s = time.perf_counter() - t0
    full_during_load = sum(1 for p in passes if p["generation"] == 2)

    def full_ms() -> float:
        times = []
        for _ in range(5):
            t = time.perf_counter()
            gc.collect()
            times.append((time.perf_counter() - t) * 1000)
        return statistics.median(times)

    before = full_ms()
    frozen = gcpolicy.freeze_loaded()
    after = full_ms()
    engine.close()
    return {"paused": paused, "load_s": round(load_s, 2), "first_pass_ms": round(first_ms, 1), "full_passes_during_load": full_during_load,
            "objects": objects, "frozen": frozen, "full_ms_unfrozen": round(before, 1),
            "full_ms_frozen": round(after, 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", choices=["on", "paused"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.model_dir, args.one == "paused")))
        return
    rows: dict[str, list[dict]] = {"on": [], "paused": []}
    for _ in range(args.repeats):
        for mode in ("on", "paused"):  # alternating: a drifting host slows both alike
            cmd = [sys.executable, "-m", "bench.studies.2026-12-02-gc-cost.gc_cost", "--one", mode]
            if args.model_dir:
                cmd += ["--model-dir", args.model_dir]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            rows[mode].append(json.loads(out))
            print(mode, out, flush=True)
    for mode, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "paused"}
        print(f"median, collection {mode} while loading: {med}")


if __name__ == "__main__":
    main()
