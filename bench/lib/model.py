"""The benchmark's model: the tiny random-weight CosyVoice2 dir, built once into the cache.

    python -m bench.lib.model            # prints the model dir

Run as a subprocess by the drivers so that they never import torch themselves.
"""

from __future__ import annotations

import subprocess
import sys

from bench.lib.procs import ROOT, THREAD_ENV


def ensure_model(version: int = 2) -> str:
    """Build (once) or find the tiny model in cosyserve's default cache; returns its path."""
    import os

    out = subprocess.run([sys.executable, "-m", "bench.lib.model", str(version)], cwd=ROOT, check=True,
                         env={**os.environ, **THREAD_ENV}, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    from app.devmodels.tiny import ensure_tiny_model
    from app.settings import DEFAULT_CACHE

    version = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    print(ensure_tiny_model(DEFAULT_CACHE / "models", version))


if __name__ == "__main__":
    main()
