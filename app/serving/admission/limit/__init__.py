"""Admission limits: a ``Limit`` (protocol.py), ``FixedLimit`` or ``AdaptiveLimit``, and the adaptive one's jobs.

Reading order: protocol.py, fixed.py, adaptive.py (the windows and how the jobs compose), then
its jobs: baseline.py (the unloaded latency), waiting.py (the waiting room), levels.py and
knee.py (the knee search). The design and its measurements: docs/design/limiter.md.
"""

from app.serving.admission.limit.adaptive import AdaptiveConfig, AdaptiveLimit
from app.serving.admission.limit.fixed import FixedLimit
from app.serving.admission.limit.protocol import Limit

__all__ = ["AdaptiveConfig", "AdaptiveLimit", "FixedLimit", "Limit"]
