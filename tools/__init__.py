"""Repository tools run as `python -m tools.X` (docs/gpu.md names gpu_wheels)."""
