"""The LLM stage: CosyVoice2/3's LLM continuously batched across requests.

``kv`` (the batched key/value cache), ``forward`` (our forward over the LLM's modules),
``prefill`` (joiners prefilled together), ``sampling`` (CosyVoice's sampling rules, a
generator per sequence), ``sequence`` (one request's tokens), ``bistream`` (text fed while
speech tokens come out) and ``scheduler`` (the thread that decodes every running request in
one step). Imports nothing from ``flow`` or ``token2wav``.
"""
