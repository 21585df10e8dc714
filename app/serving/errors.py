"""Domain errors of the serving layer.

The HTTP layer maps them (one table in ``app/api/errors.py``): ``Overloaded``,
``QueueTimeout``, ``Draining`` and ``NotReady`` become 503 with a ``Retry-After``
header taken from ``retry_after_s``; ``DeadlineExceeded`` becomes 504.
Engine errors (``InvalidInput``, ``EngineFailure``) are not wrapped: they pass
through the pool unchanged.
"""

from __future__ import annotations


class ServingError(Exception):
    """Base class; ``retry_after_s`` is a whole number of seconds (>= 1) or None."""

    default_retry_after_s: float | None = None

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        value = self.default_retry_after_s if retry_after_s is None else retry_after_s
        self.retry_after_s: float | None = None if value is None else max(1.0, float(value))


class Overloaded(ServingError):
    """Admission refused at once: every slot is busy and the wait queue is full."""

    default_retry_after_s = 1.0


class QueueTimeout(ServingError):
    """The request waited in the queue longer than ``queue_timeout_s``."""

    default_retry_after_s = 1.0


class DeadlineExceeded(ServingError):
    """``request_timeout_s`` elapsed while the job was running; the engine job was cancelled."""


class Draining(ServingError):
    """The pool is draining or closed and takes no new work."""

    default_retry_after_s = 1.0


class NotReady(ServingError):
    """The engine slots are not loaded (yet, or loading failed)."""

    default_retry_after_s = 5.0


class ClientGone(ServingError):
    """The client closed the connection before its answer was ready; its work was dropped."""


class HealthCheckTimeout(ServingError):
    """The engine's health check did not return within ``health_timeout_s``."""


class RequestError(Exception):
    """A request that cannot be served as sent. ``code`` and ``param`` say what to fix.

    Subclasses pick the HTTP status in the one error table (``app/api/errors.py``).
    """

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


class BadRequest(RequestError):
    """Invalid input (unknown voice, text too long, undecodable audio, ...)."""


class Unauthorized(RequestError):
    """No API key, or one that is not configured (``server.api_keys``)."""


class NotFound(RequestError):
    """The named thing (a model, a voice) does not exist."""


class PayloadTooLarge(RequestError):
    """A body or upload over ``server.max_upload_mb``."""


class BodyTimeout(RequestError):
    """The request body did not arrive within ``server.body_timeout_s``."""


class MissingField(RequestError):
    """A required field or file is absent (rendered like a schema validation error)."""
