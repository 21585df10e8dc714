"""Prometheus metrics, one purpose a file: ``registry.py`` (``Metrics``: the families and the per-request
record), ``observers.py`` (the pool's and the engines' hooks), ``scrape.py`` (the pool's state read at
scrape time), ``gpu.py`` (GPU memory), ``edge.py`` (request bodies, held refusals, stream buffers).
``GET /metrics`` itself is a route: ``app/api/metrics.py``."""

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app.metrics.registry import OUTCOMES, Metrics, outcome_of
from app.metrics.scrape import SLOT_STATES

__all__ = ["CONTENT_TYPE_LATEST", "OUTCOMES", "SLOT_STATES", "Metrics", "outcome_of"]
