"""The one error table: every domain error's status and code, one envelope, nothing leaked."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.api.errors import ERROR_TABLE, classify, install_error_handlers
from app.audio.formats import UnsupportedFormat
from app.engines.base import EngineFailure, InvalidInput
from app.serving.errors import (
    BadRequest,
    BodyTimeout,
    ClientGone,
    DeadlineExceeded,
    Draining,
    HealthCheckTimeout,
    MissingField,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    QueueTimeout,
)
from app.voices import VoiceComputeFailed, VoiceExists, VoiceLimitReached, VoiceNotFound


@pytest.mark.parametrize("exc, status, code", [
    (BadRequest("unknown_voice", "no such voice", param="voice"), 400, "unknown_voice"),
    (MissingField("validation_error", "prompt_wav: Field required"), 422, "validation_error"),
    (NotFound("model_not_found", "no model"), 404, "model_not_found"),
    (PayloadTooLarge("payload_too_large", "too big"), 413, "payload_too_large"),
    (BodyTimeout("body_timeout", "slow"), 408, "body_timeout"),
    (ClientGone("gone"), 499, "client_closed_request"),
    (InvalidInput("text is empty"), 400, "invalid_input"),
    (UnsupportedFormat("ogg?"), 400, "unsupported_format"),
    (Overloaded("full"), 503, "overloaded"),
    (QueueTimeout("waited"), 503, "queue_timeout"),
    (Draining("bye"), 503, "draining"),
    (NotReady("loading"), 503, "not_ready"),
    (DeadlineExceeded("late"), 504, "deadline_exceeded"),
    (EngineFailure("CUDA said: secret detail"), 500, "engine_failure"),
    (VoiceNotFound("no voice"), 404, "voice_not_found"),
    (VoiceExists("taken"), 409, "voice_exists"),
    (VoiceLimitReached("full"), 409, "voice_limit_reached"),
    (VoiceComputeFailed("could not"), 500, "voice_compute_failed"),
    (KeyError("speaker"), 500, "internal_error"),
    (RuntimeError("boom with internals"), 500, "internal_error"),
])
def test_table(exc, status, code):
    info = classify(exc)
    assert (info.status, info.code) == (status, code)
    assert "secret" not in info.message and "internals" not in info.message


def test_param_and_retry_after_are_carried():
    assert classify(BadRequest("x", "m", param="voice")).param == "voice"
    assert classify(Overloaded("full", retry_after_s=3.2)).retry_after_s == pytest.approx(3.2)
    assert classify(HealthCheckTimeout("slow")).status == 500  # a ServingError without a row: generic


def test_subclasses_come_before_their_bases():
    types = [t for t, _, _ in ERROR_TABLE]
    for i, t in enumerate(types):
        for later in types[i + 1:]:
            assert not issubclass(later, t) or later is t, (t, later)


def app_raising(exc: BaseException) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/v1/tts")
    async def native() -> None:
        raise exc

    @app.get("/v1/audio/speech")
    async def openai() -> None:
        raise exc

    return TestClient(app, raise_server_exceptions=False)


def test_envelopes_native_and_openai():
    client = app_raising(BadRequest("unknown_voice", "no voice 'x'", param="voice"))
    assert client.get("/v1/tts").json() == {"error": {"code": "unknown_voice", "message": "no voice 'x'",
                                                      "request_id": ""}}
    assert client.get("/v1/audio/speech").json() == {"error": {"message": "no voice 'x'", "type":
                                                               "invalid_request_error", "param": "voice",
                                                               "code": "unknown_voice"}}


def test_unexpected_errors_are_generic_and_logged(caplog):
    client = app_raising(ValueError("internal path /secret/x"))
    r = client.get("/v1/tts")
    assert r.status_code == 500 and "/secret/x" not in r.text
    assert r.json()["error"]["code"] == "internal_error"
    assert any("unhandled error" in rec.getMessage() for rec in caplog.records)


def test_408_closes_the_connection_and_503_says_retry_after():
    r = app_raising(BodyTimeout("body_timeout", "slow")).get("/v1/tts")
    assert r.status_code == 408 and r.headers["connection"] == "close"
    r = app_raising(Overloaded("full", retry_after_s=2.5)).get("/v1/tts")
    assert r.status_code == 503 and r.headers["retry-after"] == "3"


def test_405_carries_allow(client):
    r = client.get("/v1/tts")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == "method_not_allowed"
    r = client.put("/inference_sft")
    assert r.status_code == 405 and set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}
