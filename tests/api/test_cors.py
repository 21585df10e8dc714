"""CORS (``server.cors_origins``): preflights, and headers a browser can read on every answer, 401s included."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest
from fastapi.testclient import TestClient

from app.engines.fake import FakeEngine
from app.main import create_app
from app.settings import Settings

ORIGIN = "https://app.example.com"
KEY = "sk-cors-test-key"


@pytest.fixture
def make(tmp_path, behaviour) -> Iterator[Callable[..., TestClient]]:
    with ExitStack() as stack:
        def build(origins: list[str], keys: list[str] | None = None) -> TestClient:
            settings = Settings(dev={"fake_engine": True}, pool={"workers": 1, "max_queue": 1},
                                server={"cors_origins": origins, "api_keys": keys or []},
                                voices={"dir": str(tmp_path / "voices")})
            return stack.enter_context(TestClient(create_app(settings, engine_factory=lambda i: FakeEngine(behaviour))))

        yield build


def preflight(client: TestClient, origin: str, path: str = "/v1/tts", headers: str = "authorization, content-type"):
    return client.options(path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                         "Access-Control-Request-Headers": headers})


def test_preflight_from_an_allowed_origin_needs_no_key(make):
    r = preflight(make([ORIGIN], keys=[KEY]), ORIGIN, headers="authorization, x-api-key, content-type")
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "x-api-key", "content-type"} <= allowed
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "access-control-allow-credentials" not in r.headers


def test_preflight_from_another_origin_is_refused(make):
    r = preflight(make([ORIGIN]), "https://evil.example.net")
    assert r.status_code == 400
    assert "access-control-allow-origin" not in r.headers


def test_a_401_carries_cors_headers_so_the_page_can_read_it(make):
    r = make([ORIGIN], keys=[KEY]).post("/v1/tts", json={"text": "hi"}, headers={"Origin": ORIGIN})
    assert r.status_code == 401
    assert r.headers["access-control-allow-origin"] == ORIGIN
    exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    assert {"www-authenticate", "x-request-id", "x-sample-rate", "retry-after"} <= exposed
    assert r.json()["error"]["code"] == "missing_api_key"


def test_audio_responses_expose_the_sample_rate(make):
    r = make([ORIGIN], keys=[KEY]).post("/v1/tts", json={"text": "hi", "format": "pcm"},
                                        headers={"Origin": ORIGIN, "X-API-Key": KEY})
    assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
    assert r.headers["access-control-allow-origin"] == ORIGIN


def test_any_origin(make):
    client = make(["*"])
    r = client.get("/v1/speakers", headers={"Origin": "https://anywhere.example.org"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    assert preflight(client, "https://anywhere.example.org").status_code == 200


def test_no_origins_no_cors_headers(make):
    client = make([])
    r = client.get("/v1/speakers", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    assert preflight(client, ORIGIN).status_code == 405  # no CORS: OPTIONS is just another method
