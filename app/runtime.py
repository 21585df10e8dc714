"""The live services of one server instance, built by the lifespan and shared by the routers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.config import Settings
from app.serving.session import SessionLimits, SessionRegistry

if TYPE_CHECKING:
    from app.metrics import Metrics
    from app.serving.pool import EnginePool
    from app.serving.speech import SpeechService
    from app.voices.library import VoiceLibrary


@dataclass
class Runtime:
    settings: Settings
    voices: VoiceLibrary | None = None
    metrics: Metrics | None = None
    pool: EnginePool | None = None  # set by the lifespan once every slot is loaded
    speech: SpeechService | None = None  # set by the lifespan with the pool
    sessions: SessionRegistry = field(default_factory=SessionRegistry)  # live WebSocket sessions (drain)
    session_limits: SessionLimits = field(default_factory=SessionLimits)  # set by the lifespan from settings
    draining: bool = False
    model_created: int = 0  # unix time the model was loaded (OpenAI's "created")
