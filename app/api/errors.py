"""THE error table: domain error -> HTTP status, error code and JSON envelope.

Every error response has one shape::

    {"error": {"code": "...", "message": "...", "request_id": "..."}}

The OpenAI surface renders the same table in OpenAI's error object shape
(``{"error": {"message", "type", "param", "code"}}``). Unexpected exceptions
never leak their text: they become a generic 500 and are logged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.api.context import RequestContext, context_of
from app.api.routes import is_openai_path
from app.audio.formats import UnsupportedFormat
from app.engines.base import EngineFailure, InvalidInput
from app.serving.bounds import QUOTE_CHARS
from app.serving.errors import (
    BadRequest,
    BodyTimeout,
    ClientGone,
    DeadlineExceeded,
    Draining,
    MissingField,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    QueueTimeout,
    RequestError,
    ServingError,
    Unauthorized,
)
from app.serving.session import TooManySessions
from app.voices.library import (
    VoiceComputeFailed,
    VoiceError,
    VoiceExists,
    VoiceLimitReached,
    VoiceNotFound,
    VoiceStorageFull,
)

log = logging.getLogger("cosyserve.api")


@dataclass(frozen=True)
class ErrorInfo:
    status: int
    code: str
    message: str
    retry_after_s: float | None = None
    param: str | None = None


# Status of a client that hung up (nginx's convention); nobody reads the body, the log does.
CLIENT_GONE_STATUS = 499

# (exception type, status, code); the first match wins, so subclasses come first.
# A RequestError carries its own code (and param); the others take the code here.
ERROR_TABLE: tuple[tuple[type[BaseException], int, str], ...] = (
    (BadRequest, 400, "invalid_input"),
    (Unauthorized, 401, "invalid_api_key"),
    (MissingField, 422, "validation_error"),
    (NotFound, 404, "not_found"),
    (PayloadTooLarge, 413, "payload_too_large"),
    (BodyTimeout, 408, "body_timeout"),
    (ClientGone, CLIENT_GONE_STATUS, "client_closed_request"),
    (InvalidInput, 400, "invalid_input"),
    (UnsupportedFormat, 400, "unsupported_format"),
    (TooManySessions, 503, "session_limit"),
    (Overloaded, 503, "overloaded"),
    (QueueTimeout, 503, "queue_timeout"),
    (Draining, 503, "draining"),
    (NotReady, 503, "not_ready"),
    (DeadlineExceeded, 504, "deadline_exceeded"),
    (EngineFailure, 500, "engine_failure"),
    (VoiceNotFound, 404, "voice_not_found"),
    (VoiceExists, 409, "voice_exists"),
    (VoiceLimitReached, 409, "voice_limit_reached"),
    (VoiceComputeFailed, 500, "voice_compute_failed"),
    (VoiceStorageFull, 507, "voice_storage_full"),
)

OPENAI_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                408: "invalid_request_error", 409: "invalid_request_error", CLIENT_GONE_STATUS: "invalid_request_error",
                413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
                503: "server_overloaded", 504: "timeout", 500: "server_error", 507: "server_error"}


def classify(exc: BaseException) -> ErrorInfo:
    for exc_type, status, code in ERROR_TABLE:
        if isinstance(exc, RequestError) and isinstance(exc, exc_type):
            return ErrorInfo(status, exc.code or code, exc.message or code, param=exc.param)
        if isinstance(exc, exc_type):
            message = exc.message if isinstance(exc, ServingError) else str(exc)
            if isinstance(exc, EngineFailure):
                message = "the engine failed to synthesise this request"
            retry = exc.retry_after_s if isinstance(exc, ServingError) else None
            return ErrorInfo(status, code, message or code, retry_after_s=retry)
    return ErrorInfo(500, "internal_error", "internal server error")


def is_openai_route(request: Request) -> bool:
    return is_openai_path(request.url.path)


def envelope(path: str, info: ErrorInfo, request_id: str) -> dict:
    """The error body for ``path``: OpenAI's error object on OpenAI routes, ours elsewhere."""
    if is_openai_path(path):
        return {"error": {"message": info.message, "type": OPENAI_TYPES.get(info.status, "invalid_request_error"),
                          "param": info.param, "code": info.code}}
    return {"error": {"code": info.code, "message": info.message, "request_id": request_id}}


def answer(ctx: RequestContext, path: str, info: ErrorInfo, headers: dict[str, str] | None = None) -> JSONResponse:
    """The error response for a request to ``path``; its code is noted in the request's ``ctx``."""
    headers = dict(headers or {})
    if info.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(info.retry_after_s)))
    if info.status == 408:
        headers["Connection"] = "close"  # the rest of the body may still be on its way
    ctx.error_code = info.code
    return JSONResponse(envelope(path, info, ctx.request_id), status_code=info.status, headers=headers)


def render_scope(scope: dict, info: ErrorInfo, headers: dict[str, str] | None = None) -> JSONResponse:
    """The error response for an ASGI scope (``http``, or a ``websocket`` handshake being denied): the ASGI
    middlewares' form, which work on the scope."""
    return answer(context_of(scope), scope.get("path", ""), info, headers)


def render(request: Request, ctx: RequestContext, info: ErrorInfo,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return answer(ctx, request.scope.get("path", ""), info, headers)


def short(part: object) -> str:
    """One part of a field's location for a message: an unknown field's name is the client's, so capped."""
    text = str(part)
    return text if len(text) <= QUOTE_CHARS else f"{text[:QUOTE_CHARS]}..."


def _bad_unicode(exc: RequestValidationError) -> bool:
    """The JSON body held a lone surrogate (``"\\ud800"``) or a broken ``\\u`` escape: invalid input, as on
    every other surface, not a schema mismatch."""
    return any(err.get("type") == "string_unicode" or
               (err.get("type") == "json_invalid" and ("surrogate" in str(err.get("msg")) or
                                                       "hex escape" in str(err.get("msg")))) for err in exc.errors())


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors():
        loc = [short(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "form")]
        where = ".".join(loc) or "body"
        param = param or (loc[-1] if loc else None)
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", param


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return ", ".join(allowed)


Handler = Callable[[Request, RequestContext, Any], JSONResponse]  # Any: each takes its own exception type


def _with_context(handle: Handler) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    """An exception handler (it gets only the request) that reads the request's context once and hands it on."""
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        return handle(request, context_of(request.scope), exc)

    return handler


def install_error_handlers(app: FastAPI) -> None:
    def on_known(request: Request, ctx: RequestContext, exc: Exception) -> JSONResponse:
        info = classify(exc)
        if info.status >= 500 and info.status not in (503, 504, 507):  # 507: logged once, in a line, where it arose
            log.error("request %s failed: %s", ctx.request_id, type(exc).__name__, exc_info=exc)
        return render(request, ctx, info)

    def on_validation(request: Request, ctx: RequestContext, exc: RequestValidationError) -> JSONResponse:
        if _bad_unicode(exc):
            return render(request, ctx, ErrorInfo(400, "invalid_input", "the body holds a lone surrogate (half "
                                                  "of a UTF-16 pair, e.g. \\ud800) or a broken \\u escape: send "
                                                  "valid Unicode text"))
        message, param = _validation_message(exc)
        return render(request, ctx, ErrorInfo(422 if not is_openai_route(request) else 400, "validation_error",
                                              message, param=param))

    def on_http(request: Request, ctx: RequestContext, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(request) or headers.get("Allow", "")
        return render(request, ctx, ErrorInfo(exc.status_code, code, str(exc.detail)), headers=headers)

    def on_unexpected(request: Request, ctx: RequestContext, exc: Exception) -> JSONResponse:
        log.error("unhandled error in request %s", ctx.request_id, exc_info=exc)
        return render(request, ctx, ErrorInfo(500, "internal_error", "internal server error"))

    for exc_type in (RequestError, ServingError, InvalidInput, EngineFailure, UnsupportedFormat, VoiceError):
        app.add_exception_handler(exc_type, _with_context(on_known))
    app.add_exception_handler(RequestValidationError, _with_context(on_validation))
    app.add_exception_handler(StarletteHTTPException, _with_context(on_http))
    app.add_exception_handler(Exception, _with_context(on_unexpected))
