"""Continuous batching of CosyVoice2/3's LLM across requests (see ``scheduler.py``).

``kv`` (a batched key/value cache), ``lm`` (our forward over the LLM's modules),
``sampling`` (CosyVoice's sampling rules, a generator per sequence),
``scheduler`` (the thread that decodes every running request in one step) and
``token2wav`` (the per-request streaming schedule over ``model.token2wav``).
"""
