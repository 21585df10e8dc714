"""Random-weight CosyVoice model dirs built from the real classes (tiny for tests, full-size for benchmarks).

A fixture factory: only the lifespan (the embedded default model) and the CLI import it.
"""
