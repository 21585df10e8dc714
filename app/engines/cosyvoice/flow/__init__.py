"""The flow stage: speech tokens -> mel, per request or in batched rounds.

``runtime`` (steps, guidance, the estimator's runtime) and ``onnx`` (the estimator on ONNX
Runtime); ``cache`` (per-request estimator caches between streamed hops), ``budget`` (their
memory bound) and ``prefix`` (a voice's prompt frames computed once); ``batch`` (one batched
flow call over many requests' hops) and ``scheduler`` (the thread that runs those rounds).
Imports nothing from ``llm`` or ``token2wav``.
"""
