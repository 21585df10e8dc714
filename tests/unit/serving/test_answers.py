"""The answer cache's tiers, key and one-computation-per-key rule."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from app.engines.base import PromptAudio, SynthesisRequest
from app.serving.answers import Answer, AnswerCache, CacheConfig
from app.serving.answers.cache import Flight
from app.serving.answers.disk import SUFFIX, DiskTier
from app.serving.answers.key import answer_key, request_parts
from app.serving.answers.memory import MemoryTier
from app.serving.encoded import OutputSpec


def answer(n: int, chunks: int = 1, fill: int = 1) -> Answer:
    return Answer("audio/wav", 24000, 0.5, tuple(bytes([fill]) * n for _ in range(chunks)))


def config(**kw) -> CacheConfig:
    base = {"enabled": True, "memory_bytes": 1 << 20, "disk_dir": None, "disk_bytes": 1 << 20,
            "max_entry_bytes": 1 << 16, "derive_seed": False, "per_key": True}
    return CacheConfig(**{**base, **kw})


# -- memory --------------------------------------------------------------------------------------
def test_memory_never_exceeds_its_budget_and_evicts_least_recently_used():
    tier = MemoryTier(10_000)
    for i in range(40):
        tier.put(f"k{i}", answer(1000))
        assert tier.bytes <= tier.budget
        if i >= 3:
            tier.get("k0")  # kept warm: never evicted
    assert "k0" in tier and "k1" not in tier and tier.evictions > 0
    assert tier.bytes == sum(tier.get(k).size for k in list(tier._items))


def test_memory_refuses_an_answer_larger_than_its_budget():
    tier = MemoryTier(1000)
    assert not tier.put("big", answer(2000)) and len(tier) == 0 and tier.bytes == 0


# -- disk ----------------------------------------------------------------------------------------
def test_disk_round_trip_keeps_the_chunks(tmp_path):
    tier = DiskTier(tmp_path, 1 << 20)
    a = Answer("audio/pcm", 16000, 1.25, (b"ab", b"", b"cde"))
    assert tier.put("ab" * 32, a)
    assert DiskTier(tmp_path, 1 << 20).get("ab" * 32) == a  # another process (replica) reads it


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "garbage"])
def test_a_damaged_or_foreign_file_is_a_miss_and_removed(tmp_path, damage):
    tier = DiskTier(tmp_path, 1 << 20)
    key, other = "a" * 64, "ab" + "c" * 62
    tier.put(key, answer(500))
    path = tier.path(key)
    raw = path.read_bytes()
    if damage == "flip":
        path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        path.write_bytes(os.urandom(300))
    else:  # a valid answer for another key, under this key's name
        tier.put(other, answer(500, fill=2))
        os.replace(tier.path(other), path)
    assert tier.get(key) is None and not path.exists() and tier.corrupt == 1


def test_disk_stays_within_its_budget_and_evicts_the_oldest(tmp_path):
    tier = DiskTier(tmp_path, 20_000)
    for i in range(30):
        assert tier.put(f"{i:02d}" + "f" * 62, answer(1500))
        on_disk = sum(f.stat().st_size for f in tmp_path.rglob(f"*{SUFFIX}"))
        assert on_disk <= tier.budget and tier.bytes == on_disk
    assert tier.evictions > 0
    assert tier.get("29" + "f" * 62) is not None and tier.get("00" + "f" * 62) is None
    assert not tier.put("ff" * 32, answer(30_000))  # larger than the whole budget: not written


def test_stale_temp_files_are_removed_at_start_and_young_ones_kept(tmp_path):
    (tmp_path / "ab").mkdir()
    stale, young = tmp_path / "ab" / ".tmp-old-x.answer", tmp_path / "ab" / ".tmp-new-y.answer"
    stale.write_bytes(b"x" * 10)
    young.write_bytes(b"y" * 10)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    DiskTier(tmp_path, 1 << 20)
    assert not stale.exists() and young.exists()


# -- key -----------------------------------------------------------------------------------------
def out(fmt="wav", stream=False, rate=None) -> OutputSpec:
    return OutputSpec.build(fmt, stream, 24000, rate)


def test_the_key_names_what_determines_the_bytes_and_no_secret():
    req = SynthesisRequest(text="hi", seed=1)
    k = answer_key("m", request_parts(req, None), 1, out(), None)
    assert k == answer_key("m", request_parts(SynthesisRequest(text="hi", seed=1), None), 1, out(), None)
    others = {
        answer_key("m2", request_parts(req, None), 1, out(), None),
        answer_key("m", request_parts(req, "voice-a"), 1, out(), None),
        answer_key("m", request_parts(SynthesisRequest(text="hi."), None), 1, out(), None),
        answer_key("m", request_parts(req, None), 2, out(), None),
        answer_key("m", request_parts(req, None), 1, out("mp3"), None),
        answer_key("m", request_parts(req, None), 1, out(rate=16000), None),
        answer_key("m", request_parts(req, None), 1, out(stream=True), None),
        answer_key("m", request_parts(req, None), 1, out(), "tenant"),
    }
    assert k not in others and len(others) == 8


def test_uploaded_audio_is_keyed_by_its_samples():
    def with_audio(x: np.ndarray) -> str:
        parts = request_parts(SynthesisRequest(text="hi", mode="zero_shot", prompt_audio=PromptAudio(x, 16000)), None)
        return answer_key("m", parts, 1, out(), None)

    a = np.zeros(1600, dtype=np.float32)
    b = a.copy()
    b[10] = 0.5
    assert with_audio(a) == with_audio(a.copy()) != with_audio(b)


def test_no_seed_no_key_unless_derived():
    cache = AnswerCache(config(), "m")
    assert cache.key(SynthesisRequest(text="hi"), None, out(), None) is None
    derived = AnswerCache(config(derive_seed=True), "m")
    r1, r2 = SynthesisRequest(text="hi"), SynthesisRequest(text="hi")
    k1, k2 = derived.key(r1, None, out(), None), derived.key(r2, None, out(), None)
    assert k1 == k2 and r1.seed == r2.seed is not None
    r3 = SynthesisRequest(text="ho")
    derived.key(r3, None, out(), None)
    assert r3.seed != r1.seed


def test_keys_are_per_tenant_unless_shared():
    req = SynthesisRequest(text="hi", seed=1)
    per_key = AnswerCache(config(), "m")
    assert per_key.key(req, None, out(), "a") != per_key.key(req, None, out(), "b")
    shared = AnswerCache(config(per_key=False), "m")
    assert shared.key(req, None, out(), "a") == shared.key(req, None, out(), "b")


# -- one computation per key -----------------------------------------------------------------------
def test_identical_misses_wait_for_one_computation():
    async def main() -> None:
        cache = AnswerCache(config(), "m")
        lead = await cache.fetch("k")
        assert isinstance(lead, Flight)
        waiting = [asyncio.ensure_future(cache.fetch("k")) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiting) and cache.waits == 3
        lead.feed(b"abc")
        lead.end(True, "audio/wav", 24000, 0.1)
        got = await asyncio.gather(*waiting)
        assert all(isinstance(g, Answer) and g.data == b"abc" for g in got)
        assert cache.misses == 1 and cache.hits["memory"] == 3

    asyncio.run(main())


def test_a_failed_computation_hands_the_key_to_a_waiter():
    async def main() -> None:
        cache = AnswerCache(config(), "m")
        lead = await cache.fetch("k")
        waiter = asyncio.ensure_future(cache.fetch("k"))
        await asyncio.sleep(0.01)
        lead.end(False)
        second = await waiter
        assert isinstance(second, Flight) and cache.memory.get("k") is None
        second.end(False)
        assert "k" not in cache._flights

    asyncio.run(main())


def test_an_answer_over_the_entry_limit_is_sent_not_stored():
    async def main() -> None:
        cache = AnswerCache(config(max_entry_bytes=100), "m")
        lead = await cache.fetch("k")
        for _ in range(3):
            lead.feed(b"x" * 40)
        lead.end(True, "audio/wav", 24000, 1.0)
        assert cache.memory.get("k") is None and cache.too_large == 1

    asyncio.run(main())


def test_the_directory_fills_memory_after_a_restart(tmp_path):
    async def main() -> None:
        first = AnswerCache(config(disk_dir=str(tmp_path)), "m")
        lead = await first.fetch("k" * 64)
        lead.feed(b"pcm")
        lead.end(True, "audio/pcm", 24000, 0.2)
        await first.close()
        second = AnswerCache(config(disk_dir=str(tmp_path)), "m")
        got = await second.fetch("k" * 64)
        assert isinstance(got, Answer) and got.data == b"pcm" and second.hits["disk"] == 1
        assert isinstance(await second.fetch("k" * 64), Answer) and second.hits["memory"] == 1

    asyncio.run(main())
