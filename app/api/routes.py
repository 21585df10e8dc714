"""THE route table of the synthesis endpoints.

One list drives three things: the routers register their handlers from it
(``register``), admission at the edge recognises synthesis requests by it
(``match``), and the metrics pre-bind one ``endpoint`` label per entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter


@dataclass(frozen=True)
class SynthesisRoute:
    name: str  # handler / operation id stem
    path: str
    methods: tuple[str, ...]
    surface: str  # native | openai | upstream
    summary: str


SYNTHESIS_ROUTES: tuple[SynthesisRoute, ...] = (
    SynthesisRoute("tts", "/v1/tts", ("POST",), "native", "Synthesise speech (JSON or multipart with prompt audio)"),
    SynthesisRoute("create_speech", "/v1/audio/speech", ("POST",), "openai", "Create speech (OpenAI-compatible)"),
    SynthesisRoute("inference_sft", "/inference_sft", ("GET", "POST"), "upstream", "Upstream: preset speaker"),
    SynthesisRoute("inference_zero_shot", "/inference_zero_shot", ("GET", "POST"), "upstream",
                   "Upstream: zero-shot voice cloning"),
    SynthesisRoute("inference_cross_lingual", "/inference_cross_lingual", ("GET", "POST"), "upstream",
                   "Upstream: cross-lingual cloning"),
    SynthesisRoute("inference_instruct", "/inference_instruct", ("GET", "POST"), "upstream",
                   "Upstream: preset speaker with instruction"),
    SynthesisRoute("inference_instruct2", "/inference_instruct2", ("GET", "POST"), "upstream",
                   "Upstream: prompt voice with instruction"),
)
_BY_PATH = {r.path: r for r in SYNTHESIS_ROUTES}
ENDPOINTS: tuple[str, ...] = tuple(r.path for r in SYNTHESIS_ROUTES)
OPENAI_PREFIXES = ("/v1/audio/", "/v1/models")


def route(name: str) -> SynthesisRoute:
    for r in SYNTHESIS_ROUTES:
        if r.name == name:
            return r
    raise KeyError(name)


def match(scope: dict[str, Any]) -> SynthesisRoute | None:
    """The synthesis route this request is for, or None (probes, listings, other methods)."""
    r = _BY_PATH.get(scope.get("path", ""))
    return r if r is not None and scope.get("method") in r.methods else None


def is_openai_path(path: str) -> bool:
    """Routes whose errors use OpenAI's error object."""
    return path.startswith(OPENAI_PREFIXES)


def register(router: APIRouter, name: str, by_method: dict[str, dict[str, Any]] | None = None,
             **openapi: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a handler for the table's route ``name`` (one operation per method).

    ``openapi`` goes to every operation; ``by_method[METHOD]`` adds to (and wins over) it.
    """
    spec = route(name)

    def add(handler: Callable[..., Any]) -> Callable[..., Any]:
        for method in spec.methods:
            op_id = spec.name if len(spec.methods) == 1 else f"upstream_{spec.name}_{method.lower()}"
            extra = {**openapi, **(by_method or {}).get(method, {})}
            router.add_api_route(spec.path, handler, methods=[method], summary=spec.summary,
                                 operation_id=op_id, **extra)
        return handler

    return add
