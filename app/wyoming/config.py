"""The Wyoming service's runtime config: every value from ``app/settings/runtime.py`` (the ``wyoming`` section)."""

from __future__ import annotations

from dataclasses import dataclass

from app.serving.admission.classes import Priority
from app.serving.session import SessionLimits


@dataclass(frozen=True)
class WyomingConfig:
    host: str
    port: int
    limits: SessionLimits  # the WebSocket sessions' limits, max_sessions: wyoming.max_sessions
    priority: Priority  # every utterance's traffic class
    samples_per_chunk: int  # most samples in one audio-chunk event
    max_event_bytes: int  # one event's header line, data and payload, each; beyond: the connection is closed
