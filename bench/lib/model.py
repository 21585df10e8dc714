"""The benchmark's models: the tiny random-weight CosyVoice2 dir, built once into the cache, and the full-size one.

    python -m bench.lib.model            # prints the model dir

Run as a subprocess by the drivers so that they never import torch themselves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.lib.procs import ROOT, THREAD_ENV, python_module, shown

FULL_DIR = ROOT / ".cache" / "full2"


def ensure_model(version: int = 2) -> str:
    """Build (once) or find the tiny model in cosyserve's default cache; returns its path."""
    out = subprocess.run([sys.executable, "-m", "bench.lib.model", str(version)], cwd=ROOT, check=True,
                         env={**os.environ, **THREAD_ENV}, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def ensure_full_model(path: str | Path = FULL_DIR) -> str:
    """Build (once, ~1-3 min, 3.4 GB) or find the full-size random-weight CosyVoice2 dir at ``path``; built
    beside it and renamed into place, so a build cut short is never taken for a model."""
    from app.engines.cosyvoice.layout import TINY_MARKER

    path = Path(path)
    if not (path / TINY_MARKER).is_file():
        print(f"building the full-size random-weight CosyVoice2 dir into {shown(path)} (~1-3 min, 3.4 GB)", flush=True)
        building = path.with_name(path.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        subprocess.run(python_module("app.cli", "make-tiny-model", "--version", "2", "--full-size", str(building)),
                       cwd=ROOT, check=True, env={**os.environ, **THREAD_ENV})
        shutil.rmtree(path, ignore_errors=True)
        building.rename(path)
    return str(path)


def main() -> None:
    from app.devmodels.tiny import ensure_tiny_model
    from app.settings import DEFAULT_CACHE

    version = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    print(ensure_tiny_model(DEFAULT_CACHE / "models", version))


if __name__ == "__main__":
    main()
