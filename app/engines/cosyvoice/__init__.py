"""The CosyVoice adapter: the Engine contract over the real CosyVoice classes (v1, v2, v3).

The only package that imports torch or CosyVoice. ``engine`` is the adapter; ``load``
builds a model dir with the real classes; ``batching/`` is the shared batched core.
"""
