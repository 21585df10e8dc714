"""The live services of one server instance, built by the lifespan and shared by the routers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.config import Settings


@dataclass
class Runtime:
    settings: Settings
    pool: Any = None  # app.serving.pool.EnginePool
    voices: Any = None  # app.voices.library.VoiceLibrary
    metrics: Any = None  # app.metrics.Metrics
    draining: bool = False
    extras: dict = field(default_factory=dict)
