"""The answer cache over HTTP (fake engines): a seeded repeat is a hit, sent without the engine or a permit."""

from __future__ import annotations

import threading
import time

from tests.support.fake_app import hold
from tests.support.metrics import scrape, value
from tests.support.sounds import prompt_wav
from tests.support.waiting import wait_until


def register(client, name: str, transcript: str = "hello there, this is my voice"):
    return client.post("/v1/voices", data={"name": name, "transcript": transcript},
                       files={"audio": ("a.wav", prompt_wav(), "application/octet-stream")})


def test_a_seeded_repeat_is_a_hit_with_the_same_bytes_and_no_engine_work(open_client, behaviour):
    client = open_client()
    body = {"text": "press one for sales", "seed": 7, "format": "wav"}
    first = client.post("/v1/tts", json=body)
    second = client.post("/v1/tts", json=body)
    assert first.status_code == second.status_code == 200
    assert first.headers["x-cache"] == "miss" and second.headers["x-cache"] == "hit"
    assert second.content == first.content and second.headers["content-type"] == first.headers["content-type"]
    assert len(behaviour.started) == 1  # the hit never reached an engine
    metrics = scrape(client)
    assert value(metrics, "tts_cache_lookups_total", result="hit", tier="memory") == 1
    assert value(metrics, "tts_cache_lookups_total", result="miss", tier="") == 1
    assert value(metrics, "tts_cache_bytes", tier="memory") >= len(first.content)
    assert value(metrics, "tts_cache_budget_bytes", tier="memory") == 64 * 1024 * 1024


def test_what_the_key_covers_each_change_is_a_miss(open_client, behaviour):
    client = open_client()
    other = client.get("/v1/speakers").json()["speakers"][1]  # not the default (first) preset
    base = {"text": "hello", "seed": 1, "format": "wav"}
    variants = [base, {**base, "seed": 2}, {**base, "text": "hello!"}, {**base, "format": "pcm"},
                {**base, "sample_rate": 16000}, {**base, "speed": 1.5}, {**base, "stream": True},
                {**base, "voice": other}, {**base, "normalize": False}]
    for body in variants:
        assert client.post("/v1/tts", json=body).headers["x-cache"] == "miss", body
    assert len(behaviour.started) == len(variants)
    for body in variants:
        assert client.post("/v1/tts", json=body).headers["x-cache"] == "hit", body
    assert len(behaviour.started) == len(variants)


def test_unseeded_requests_are_not_cached(open_client, behaviour):
    client = open_client()
    for _ in range(2):
        r = client.post("/v1/tts", json={"text": "hello"})
        assert r.status_code == 200 and "x-cache" not in r.headers
    assert len(behaviour.started) == 2


def test_derive_seed_caches_unseeded_repeats(open_client, behaviour):
    client = open_client(cache={"derive_seed": True})
    a, b = (client.post("/v1/tts", json={"text": "your table is ready"}) for _ in range(2))
    assert (a.headers["x-cache"], b.headers["x-cache"]) == ("miss", "hit") and a.content == b.content
    assert len(behaviour.started) == 1


def test_no_cache_computes_afresh_and_no_store_bypasses(open_client, behaviour):
    client = open_client()
    body = {"text": "hello", "seed": 3}
    client.post("/v1/tts", json=body)
    fresh = client.post("/v1/tts", json=body, headers={"Cache-Control": "no-cache"})
    assert fresh.headers["x-cache"] == "miss" and len(behaviour.started) == 2
    bypass = client.post("/v1/tts", json=body, headers={"Cache-Control": "no-store"})
    assert "x-cache" not in bypass.headers and len(behaviour.started) == 3
    assert client.post("/v1/tts", json=body).headers["x-cache"] == "hit" and len(behaviour.started) == 3


def test_a_streamed_hit_streams_the_stored_chunks(open_client, behaviour):
    client = open_client()
    body = {"text": "hello", "seed": 5, "stream": True, "format": "pcm"}
    with client.stream("POST", "/v1/tts", json=body) as r:
        first = [c for c in r.iter_raw()]
    with client.stream("POST", "/v1/tts", json=body) as r:
        assert r.headers["x-cache"] == "hit"
        second = [c for c in r.iter_raw()]
    assert b"".join(first) == b"".join(second) and len(b"".join(first)) > 0
    assert len(behaviour.started) == 1


def test_openai_seed_extension_is_cached_and_sse_replays(open_client, behaviour):
    client = open_client()
    body = {"model": "tts-1", "input": "hello", "voice": "alloy", "response_format": "pcm", "seed": 11}
    a, b = (client.post("/v1/audio/speech", json=body) for _ in range(2))
    assert (a.headers["x-cache"], b.headers["x-cache"]) == ("miss", "hit") and a.content == b.content
    sse = {**body, "stream_format": "sse"}
    c, d = (client.post("/v1/audio/speech", json=sse) for _ in range(2))
    assert d.headers["x-cache"] == "hit" and c.text.count("speech.audio.delta") == d.text.count("speech.audio.delta")
    assert "speech.audio.done" in d.text
    assert len(behaviour.started) == 1  # SSE frames the stored raw bytes: one answer for both


def test_a_hit_is_served_while_every_engine_is_busy(open_client, behaviour):
    client = open_client(pool={"workers": 1, "max_queue": 0, "admission": "fixed"})
    body = {"text": "cached", "seed": 9}
    assert client.post("/v1/tts", json=body).headers["x-cache"] == "miss"
    gate = hold(behaviour)
    held = threading.Thread(target=lambda: client.post("/v1/tts", json={"text": "long"}))
    held.start()
    wait_until(lambda: len(behaviour.started) == 2)
    assert client.post("/v1/tts", json={"text": "x"}).status_code == 503  # full: a miss is refused at once
    t0 = time.monotonic()
    hit = client.post("/v1/tts", json=body)
    assert hit.status_code == 200 and hit.headers["x-cache"] == "hit" and time.monotonic() - t0 < 1.0
    miss = client.post("/v1/tts", json={**body, "seed": 10})  # seeded but not stored: needs a permit
    assert miss.status_code == 503 and miss.json()["error"]["code"] in ("overloaded", "queue_full")
    assert "retry-after" in miss.headers
    gate.set()
    held.join(10)
    wait_until(lambda: client.app.state.runtime.pool.stats()["in_flight"] == 0)


def test_identical_misses_at_once_compute_once(open_client, behaviour):
    client = open_client(pool={"workers": 2, "max_queue": 2})
    gate = hold(behaviour)
    body = {"text": "announce", "seed": 4}
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(client.post("/v1/tts", json=body)))
               for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: len(behaviour.started) == 1)
    wait_until(lambda: client.app.state.runtime.answers.waits == 2)
    gate.set()
    for t in threads:
        t.join(10)
    assert sorted(r.headers["x-cache"] for r in results) == ["hit", "hit", "miss"]
    assert len({r.content for r in results}) == 1 and len(behaviour.started) == 1


def test_a_failed_computation_is_not_stored(open_client, behaviour):
    client = open_client()
    behaviour.fail_at_chunk = 1
    body = {"text": "hello", "seed": 8}
    assert client.post("/v1/tts", json=body).status_code >= 500
    behaviour.fail_at_chunk = None
    r = client.post("/v1/tts", json=body)
    assert r.status_code == 200 and r.headers["x-cache"] == "miss"


def test_re_registering_a_voice_makes_its_answers_unreachable(open_client, behaviour):
    client = open_client()
    assert register(client, "amy").status_code == 201
    body = {"text": "hello", "voice": "amy", "seed": 2}
    assert client.post("/v1/tts", json=body).headers["x-cache"] == "miss"
    assert client.post("/v1/tts", json=body).headers["x-cache"] == "hit"
    assert client.delete("/v1/voices/amy").status_code == 204
    assert client.post("/v1/tts", json=body).status_code == 400  # gone: not answered from the cache
    time.sleep(1.1)  # a registration's identity includes its time (seconds)
    assert register(client, "amy", transcript="another transcript").status_code == 201
    assert client.post("/v1/tts", json=body).headers["x-cache"] == "miss"


def test_answers_are_per_api_key_unless_shared(open_client, behaviour):
    client = open_client(server={"api_keys": ["key-one-0123456789abcdef", "key-two-0123456789abcdef"]})
    body = {"text": "hello", "seed": 6}
    one = {"Authorization": "Bearer key-one-0123456789abcdef"}
    two = {"Authorization": "Bearer key-two-0123456789abcdef"}
    assert client.post("/v1/tts", json=body, headers=one).headers["x-cache"] == "miss"
    assert client.post("/v1/tts", json=body, headers=two).headers["x-cache"] == "miss"  # no cross-tenant hit
    assert client.post("/v1/tts", json=body, headers=one).headers["x-cache"] == "hit"


def test_the_permit_goes_back_on_every_cached_path(open_client, behaviour):
    client = open_client(pool={"workers": 1, "max_queue": 0, "admission": "fixed"})
    stats = client.app.state.runtime.pool.stats
    for body, status in [({"text": "a", "seed": 1}, 200), ({"text": "a", "seed": 1}, 200),
                         ({"text": "a", "seed": 1, "voice": "nobody"}, 400), ({"text": "", "seed": 1}, 400),
                         ({"text": "a", "seed": -1}, 422)]:
        assert client.post("/v1/tts", json=body).status_code == status, body
        assert stats()["in_flight"] == 0, body
