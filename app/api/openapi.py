"""OpenAPI that tells the truth: request bodies and error responses of the routes that read their own body.

The speech and voice routes read their body themselves (JSON or multipart, under a
deadline, after edge admission), so FastAPI cannot see it. ``json_body`` /
``form_body`` / ``body`` document it from the same pydantic models the routes
validate with; ``errors(...)`` documents the error statuses a route can answer with
the envelope it really sends. ``install`` puts the referenced models into
``components.schemas``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

REF = "#/components/schemas/{model}"
_EXTRA_MODELS: dict[str, type[BaseModel]] = {}


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. overloaded, unknown_voice.")
    message: str = Field(description="What went wrong and what to send instead.")
    request_id: str = Field(description="Also in the X-Request-ID header.")


class ErrorEnvelope(BaseModel):
    """Every native error: ``{"error": {"code", "message", "request_id"}}``."""

    error: ErrorDetail


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorEnvelope(BaseModel):
    """Errors on the OpenAI routes, in OpenAI's shape."""

    error: OpenAIErrorDetail


ERROR_DESCRIPTIONS = {
    400: "Bad input (unknown voice, text too long, undecodable audio, unsupported mode, ...)",
    404: "Not found",
    405: "Method not allowed (the Allow header lists the methods)",
    408: "The request body did not arrive within server.body_timeout_s",
    409: "Conflict (the voice exists, the library is full)",
    413: "Body or upload over server.max_upload_mb",
    422: "The body does not match the schema",
    500: "Engine failure or internal error (details are logged, never returned)",
    503: "Overloaded, queue timeout, draining or not ready; see Retry-After",
    504: "pool.request_timeout_s passed; the engine job was cancelled",
    507: "The voices disk is full; nothing of the voice was kept",
}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}}
ALLOW = {"Allow": {"description": "The methods this path serves", "schema": {"type": "string"}}}
SPEECH_ERRORS = (400, 405, 408, 413, 422, 500, 503, 504)


def errors(*statuses: int, openai: bool = False) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for these error statuses, with the envelope schema."""
    model = OpenAIErrorEnvelope if openai else ErrorEnvelope
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": model, "description": ERROR_DESCRIPTIONS.get(status, "Error")}
        if status == 503:
            entry["headers"] = RETRY_AFTER
        if status == 405:
            entry["headers"] = ALLOW
        out[status] = entry
    return out


def audio_response(*media_types: str, description: str = "Audio",
                   sse: str | None = None) -> dict[int | str, dict[str, Any]]:
    binary = {"schema": {"type": "string", "format": "binary"}}
    content: dict[str, Any] = {m: binary for m in media_types}
    if sse:
        content["text/event-stream"] = sse_response(sse)
    return {200: {"description": description, "content": content,
                  "headers": {"X-Sample-Rate": {"description": "Sample rate of the audio", "schema":
                                                {"type": "integer"}}}}}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    _EXTRA_MODELS[model.__name__] = model
    return {"$ref": REF.format(model=model.__name__)}


def json_body(model: type[BaseModel], examples: dict[str, Any] | None = None) -> dict[str, Any]:
    content: dict[str, Any] = {"schema": _ref(model)}
    if examples:
        content["examples"] = {name: {"value": value} for name, value in examples.items()}
    return {"application/json": content}


def form_body(model: type[BaseModel], files: dict[str, str] | None = None, example: dict[str, Any] | None = None,
              required_files: tuple[str, ...] = (), urlencoded: bool = False) -> dict[str, Any]:
    """The model's fields as form fields, plus binary file fields."""
    schema = model.model_json_schema(ref_template=REF)
    schema.pop("$defs", None)
    required = list(schema.get("required", [])) + list(required_files)
    props = {name: _form_field(prop, name in required) for name, prop in schema.get("properties", {}).items()}
    for name, description in (files or {}).items():
        props[name] = {"type": "string", "format": "binary", "description": description}
    form: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        form["required"] = required
    if schema.get("additionalProperties") is False:
        form["additionalProperties"] = False
    content: dict[str, Any] = {"schema": form}
    if example:
        content["example"] = example
    out = {"multipart/form-data": content}
    if urlencoded and not files:
        out["application/x-www-form-urlencoded"] = {"schema": form}
    return out


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """The model's fields as query parameters."""
    schema = model.model_json_schema(ref_template=REF)
    required = set(schema.get("required", []))
    return [{"name": name, "in": "query", "required": name in required, "schema": prop}
            for name, prop in schema.get("properties", {}).items()]


def _form_field(prop: dict[str, Any], required: bool) -> dict[str, Any]:
    """A JSON-schema property as a form field: a form cannot send null (leave the field out),
    and an empty field counts as absent, so a required text field needs one character."""
    prop = dict(prop)
    options = prop.pop("anyOf", None)
    if options:
        kept = [o for o in options if o.get("type") != "null"]
        if prop.get("default", 0) is None:
            del prop["default"]
        prop.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
    if required and prop.get("type") == "string":
        prop.setdefault("minLength", 1)
    return prop


def sse_response(description: str) -> dict[str, Any]:
    """A text/event-stream body: each event's ``data`` is one JSON object."""
    return {"schema": {"type": "object", "required": ["data"], "description": description,
                       "properties": {"data": {"type": "string", "description": "One JSON object"},
                                      "event": {"type": "string"}}}}


PRIORITY_HEADER: dict[str, Any] = {
    "name": "X-Priority", "in": "header", "required": False,
    "schema": {"type": "string", "enum": ["interactive", "bulk"]},
    "description": "Traffic class when the body names none (docs/priority.md); else the API key's default, "
                   "else interactive. Unknown: 400 invalid_priority.",
}


def body(content: dict[str, Any], required: bool = True) -> dict[str, Any]:
    """``openapi_extra=`` for a route that reads its own body."""
    return {"requestBody": {"required": required, "content": content}}


def install(app: FastAPI) -> None:
    """Generate the schema once, with the models referenced by ``json_body`` in components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, model in _EXTRA_MODELS.items():
                model_schema = model.model_json_schema(ref_template=REF)
                for def_name, definition in model_schema.pop("$defs", {}).items():
                    components.setdefault(def_name, definition)
                components.setdefault(name, model_schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
