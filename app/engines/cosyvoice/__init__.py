"""The CosyVoice adapter: the Engine contract over the real CosyVoice classes (v1, v2, v3).

The only package that imports torch or CosyVoice. ``engine`` is the adapter; ``load``
builds a model dir with the real classes; the stages of the shared batched core are
packages: ``llm/``, ``flow/``, ``token2wav/`` (``batched`` composes them).
"""
