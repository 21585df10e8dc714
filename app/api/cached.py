"""The answer cache on the HTTP path: looked up before a permit, filled as the answer is sent.

A synthesis request whose answer is reproducible (``seed``, or ``cache.derive_seed``) on the
native ``/v1/tts`` or OpenAI ``/v1/audio/speech`` route, sent as JSON, is admitted by its
handler rather than the edge (:func:`defers_admission`), after this module looked for its
answer: a hit is sent at once, with no engine permit and no slot (``X-Cache: hit``); a miss
leads the one computation of its key (an identical request meanwhile waits for it), takes its
permit and is stored as it is sent (``X-Cache: miss``). A multipart request (uploaded audio,
whose decoding is engine work) is admitted at the edge as before and looked up after; a hit
then gives its permit back at once.

While the cache holds answers, a small JSON body on those routes is read before the overload
check (:func:`reads_before_check`), so a hit is served even when the engines are full; the
check then happens when (and if) the request needs a permit.

Request directives: ``Cache-Control: no-cache`` computes afresh and replaces the stored answer;
``no-store`` neither reads nor writes. Answers carry ``Cache-Control: no-store`` as before: the
server's cache is keyed on what the client cannot see (the model's fingerprint).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from app.api.bodies import declared_length
from app.api.priority import header
from app.serving.answers import Answer, AnswerCache
from app.serving.answers.cache import Flight
from app.serving.speech import SpeechResult

CACHED_PATHS = frozenset({"/v1/tts", "/v1/audio/speech"})
SMALL_BODY = 64 << 10  # a JSON body up to this is read before the overload check while the cache holds answers


def _lower(scope: dict[str, Any], name: bytes) -> bytes:
    return (header(scope, name) or b"").lower()


def _cacheable(scope: dict[str, Any], cache: AnswerCache | None) -> bool:
    """A JSON request on a cached route, and a cache that is on."""
    return (cache is not None and cache.enabled and scope.get("path") in CACHED_PATHS
            and _lower(scope, b"content-type").startswith(b"application/json"))


def reads_before_check(scope: dict[str, Any], cache: AnswerCache | None) -> bool:
    """Skip the edge's pre-body overload check: the cache holds answers and this may be one of them."""
    if not _cacheable(scope, cache) or (len(cache.memory) == 0 and cache.disk is None):
        return False
    length = declared_length(scope)
    return length is not None and 0 <= length <= SMALL_BODY


def defers_admission(scope: dict[str, Any], body: bytes, cache: AnswerCache | None) -> bool:
    """The handler admits this request after its cache lookup (a JSON body that may be reproducible)."""
    return _cacheable(scope, cache) and (cache.config.derive_seed or b'"seed"' in body)


def directives(scope: dict[str, Any]) -> tuple[bool, bool]:
    """(refresh, bypass) from the request's Cache-Control: no-cache refreshes, no-store bypasses."""
    words = {w.strip().split(b"=")[0] for w in _lower(scope, b"cache-control").split(b",")}
    return b"no-cache" in words, b"no-store" in words


def hit_result(answer: Answer, stream: bool) -> SpeechResult:
    """A stored answer as a speech result: whole bytes, or its chunks streamed as they were."""
    result = SpeechResult(answer.media_type, answer.sample_rate, stored_audio_s=answer.audio_s, ttfa_s=0.0)
    if stream:
        result.body = _replay(answer.chunks)
    else:
        result.data = answer.data
    return result


async def _replay(chunks: tuple[bytes, ...]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def fill(result: SpeechResult, flight: Flight) -> None:
    """Store ``result`` as it is sent: a whole answer now, a stream when its last byte was produced."""
    if result.data is not None:
        flight.feed(result.data)
        flight.end(True, result.media_type, result.sample_rate, result.audio_s)
        return
    assert result.body is not None
    result.body = _tee(result, result.body, flight)
    close = result.aclose

    async def aclose() -> None:
        flight.end(False)  # not all of it was produced (a no-op once the tee stored it)
        await close()

    result.aclose = aclose  # type: ignore[method-assign]


async def _tee(result: SpeechResult, body: AsyncIterator[bytes], flight: Flight) -> AsyncIterator[bytes]:
    complete = False
    try:
        async for data in body:
            flight.feed(data)
            yield data
        complete = True
    finally:
        flight.end(complete, result.media_type, result.sample_rate, result.audio_s)
