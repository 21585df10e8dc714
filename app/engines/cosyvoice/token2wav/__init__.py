"""The token2wav stage: a request's speech tokens -> audio, hop by hop.

``hops`` (the streaming hop schedule over ``model.token2wav``, per request or through the
flow scheduler) and ``gate`` (how many token2wav calls run at once, oldest request first).
Builds on ``flow``; imports nothing from ``llm``.
"""
