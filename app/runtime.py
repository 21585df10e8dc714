"""The live services of one server instance: built whole by the lifespan, read by the routers.

``create_app`` builds what must exist before the lifespan runs, a :class:`Boot`
(settings, metrics, an injected engine factory), in ``app.state.boot``. The
lifespan loads the engines and builds a :class:`Runtime` with every service in
place; it yields it as the lifespan state (routers: ``request.state.runtime``)
and publishes it in ``app.state.runtime``. The few readers that exist before the
lifespan and run around it (the edge admission middleware, the metrics scrape,
the signal handler) use :func:`running`, which is None until then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.heap import HeapTrimmer
from app.serving.errors import Draining
from app.serving.session import SessionLimits, SessionRegistry
from app.settings import Settings

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from app.metrics import Metrics
    from app.serving.answers import AnswerCache
    from app.serving.pool import EnginePool
    from app.serving.speech import SpeechService
    from app.voices.library import VoiceLibrary

EngineFactory = Callable[[int], Any]  # slot index -> an engine, not loaded yet


@dataclass(frozen=True)
class Boot:
    """What ``create_app`` gives the lifespan."""

    settings: Settings
    metrics: Metrics | None = None  # None when metrics.enabled is false
    engine_factory: EngineFactory | None = None  # injected engines (tests); None: built from settings


@dataclass
class Runtime:
    settings: Settings
    pool: EnginePool  # every slot loaded and warm
    speech: SpeechService
    voices: VoiceLibrary  # started: stored voices loaded
    session_limits: SessionLimits
    model_created: int  # unix time the model was loaded (OpenAI's "created")
    metrics: Metrics | None = None  # None when metrics.enabled is false
    answers: AnswerCache | None = None  # the answer cache (app/api/cached.py); None when cache.enabled is false
    trimmer: HeapTrimmer = field(default_factory=lambda: HeapTrimmer(0.0))  # the lifespan's: settings' interval
    sessions: SessionRegistry = field(default_factory=SessionRegistry)  # live WebSocket and Wyoming sessions (drain)
    draining: bool = False

    def open_session(self, handle: object, limit: int, surface: str = "websocket") -> None:
        """Count a streaming session in: Draining once the server drains, TooManySessions at its surface's limit."""
        if self.draining or self.pool.draining:
            raise Draining("the server is draining and takes no new sessions", self.pool.gate.retry_after_s())
        self.sessions.add(handle, limit, surface)


def running(app: Starlette) -> Runtime | None:
    """The app's runtime once its lifespan has built it; None before (e.g. a signal while loading)."""
    return getattr(app.state, "runtime", None)
