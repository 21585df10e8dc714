"""The answer cache on a real server: the tiny CosyVoice model's seeded answers, the openai SDK, a restart.

The tiny model shows what the cache stores is what a fresh computation gives (``no-cache``
recomputes: same bytes), whole and streamed; the fake engine shows the directory tier across a
restart and one computation for identical requests at once.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.support.metrics import metrics
from tests.support.server import ServerProcess, fake_engine_config

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TEXT = "Thank you for calling. Press one for sales, two for support."


def post(srv: ServerProcess, body: dict, **headers: str) -> httpx.Response:
    r = httpx.post(srv.base_url + "/v1/tts", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_tiny_model_seeded_answers_are_stored_and_equal_a_fresh_computation(tiny_models, tmp_path):
    config = {"engine": {"model_dir": str(tiny_models(2)), "torch_threads": 1},
              "server": {"drain_timeout_s": 10}, "voices": {"dir": str(tmp_path / "voices")}}
    with ServerProcess(tmp_path, config) as srv:
        got = []
        for body in ({"text": TEXT, "seed": 42, "format": "wav"},
                     {"text": TEXT, "seed": 42, "format": "pcm", "stream": True}):
            miss = post(srv, body)
            hit = post(srv, body)
            fresh = post(srv, body, **{"Cache-Control": "no-cache"})
            assert (miss.headers["x-cache"], hit.headers["x-cache"], fresh.headers["x-cache"]) == ("miss", "hit", "miss")
            assert len(miss.content) > 1000
            assert hit.content == miss.content == fresh.content, body
            got.append(miss.content)
        other = post(srv, {"text": TEXT, "seed": 43, "format": "wav"})
        assert other.headers["x-cache"] == "miss" and other.content != got[0]  # another seed, other audio
        m = metrics(srv)
        assert m['tts_cache_lookups_total{result="hit",tier="memory"}'] == 2
        assert m['tts_engine_jobs_total{outcome="ok"}'] == 5  # 2 misses + 2 refreshes + seed 43

        with openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=60) as client:
            def speak():
                return client.audio.speech.with_raw_response.create(
                    model="tts-1", voice="alloy", input=TEXT, response_format="wav", extra_body={"seed": 7})
            first, second = speak(), speak()
            assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "hit")
            assert first.content == second.content


def test_the_directory_tier_answers_after_a_restart(tmp_path):
    config = {**fake_engine_config(tmp_path), "cache": {"dir": str(tmp_path / "answers"), "memory_mb": 8}}
    body = {"text": "your order has shipped", "seed": 1, "format": "mp3"}
    with ServerProcess(tmp_path, config) as srv:
        first = post(srv, body)
        assert first.headers["x-cache"] == "miss"
    assert len(list((tmp_path / "answers").rglob("*.answer"))) == 1
    with ServerProcess(tmp_path, config) as srv:
        again = post(srv, body)
        assert again.headers["x-cache"] == "hit" and again.content == first.content
        m = metrics(srv)
        assert m['tts_cache_lookups_total{result="hit",tier="disk"}'] == 1
        assert m.get('tts_engine_jobs_total{outcome="ok"}', 0) == 0


def test_identical_requests_at_once_compute_once(tmp_path):
    config = fake_engine_config(tmp_path)
    config["dev"]["fake_chunk_delay_s"] = 0.3
    body = {"text": "the doors are closing", "seed": 5, "stream": True, "format": "pcm"}

    async def main(srv: ServerProcess) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
            return list(await asyncio.gather(*(client.post("/v1/tts", json=body) for _ in range(4))))

    with ServerProcess(tmp_path, config) as srv:
        answers = asyncio.run(main(srv))
        assert sorted(r.headers["x-cache"] for r in answers) == ["hit", "hit", "hit", "miss"]
        assert len({r.content for r in answers}) == 1
        m = metrics(srv)
        assert m['tts_engine_jobs_total{outcome="ok"}'] == 1 and m["tts_cache_waits_total"] == 3
