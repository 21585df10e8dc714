"""What the LLM scheduler reports (the metrics layer implements it: ``app/metrics/observers.py``)."""

from __future__ import annotations

from typing import Protocol


class LLMObserver(Protocol):
    """Receives scheduler measurements (the metrics layer implements it).

    It may also have ``on_prefill(joiners, seconds)``, called after each prefill forward
    (how many sequences joined in it, its seconds with the log-prob download), and
    ``on_flow_cache_recompute()``, which the batched runner calls when a stream does not
    fit the flow cache budget (``flow/budget.py``), and ``on_flow_cache_usage(bytes, budget,
    streams)``, called whenever what the flow caches hold changes.
    """

    def on_step(self, batch_size: int, seconds: float) -> None: ...

    def on_tokens(self, n: int) -> None: ...


class NullObserver:
    def on_step(self, batch_size: int, seconds: float) -> None:
        pass

    def on_tokens(self, n: int) -> None:
        pass
