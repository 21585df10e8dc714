"""VoiceLibrary: register once through the pool, heavy work off the loop, names reserved, deletes atomic."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from app.engines.base import PromptAudio
from app.engines.fake import FakeBehaviour, FakeEngine
from app.voices import VoiceExists, VoiceLibrary, VoiceLimitReached, VoiceNotFound
from app.voices import library as library_module
from tests.support.waiting import await_until, run


class ThreadPool:
    """The part of EnginePool the library uses; engine calls run in a worker thread."""

    def __init__(self) -> None:
        self.engine = FakeEngine(FakeBehaviour())
        self.info = self.engine.info()  # read once at load, like EnginePool
        self.presets = tuple(self.engine.voices())

    async def call(self, fn):
        return await asyncio.to_thread(fn, self.engine)


def audio(seconds: float = 2.0) -> PromptAudio:
    t = np.arange(int(seconds * 16000)) / 16000
    return PromptAudio((0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 16000)



def test_register_prepares_the_prompt_off_the_event_loop(tmp_path, monkeypatch):
    threads: list[str] = []
    real = library_module._prepare

    def spy(*args):
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(library_module, "_prepare", spy)

    async def main():
        lib, pool = VoiceLibrary(tmp_path), ThreadPool()
        await lib.start(pool)
        loop_thread = threading.current_thread().name
        meta = await lib.register(pool, "amy", "hello there", "", audio(), b"original-bytes", "wav")
        assert meta["name"] == "amy" and len(meta["audio_sha256"]) == 64
        assert lib.features("amy", "fake-1") is not None and lib.names() == ["amy"]
        return loop_thread

    loop_thread = run(main())
    assert threads and threads[0] != loop_thread


def test_names_conflicts_and_the_limit(tmp_path):
    async def main():
        lib, pool = VoiceLibrary(tmp_path, max_voices=1), ThreadPool()
        await lib.start(pool)
        await lib.register(pool, "amy", "hi", "", audio(), b"x", "wav")
        with pytest.raises(VoiceExists):
            await lib.register(pool, "amy", "hi", "", audio(), b"x", "wav")
        with pytest.raises(VoiceExists):
            await lib.register(pool, "fake_male", "hi", "", audio(), b"x", "wav")  # a preset
        with pytest.raises(VoiceLimitReached):
            await lib.register(pool, "bea", "hi", "", audio(), b"x", "wav")

    run(main())


def test_two_registrations_of_one_name_race_and_exactly_one_wins(tmp_path):
    async def main():
        lib, pool = VoiceLibrary(tmp_path), ThreadPool()
        await lib.start(pool)
        results = await asyncio.gather(*(lib.register(pool, "amy", "hi", "", audio(), b"x", "wav") for _ in range(4)),
                                       return_exceptions=True)
        assert sum(isinstance(r, dict) for r in results) == 1
        assert all(isinstance(r, VoiceExists) for r in results if not isinstance(r, dict))

    run(main())


def test_delete_and_restart_survival(tmp_path):
    async def main():
        pool = ThreadPool()
        lib = VoiceLibrary(tmp_path)
        await lib.start(pool)
        await lib.register(pool, "amy", "hi", "", audio(), b"x", "wav")
        again = VoiceLibrary(tmp_path)
        await again.start(pool)
        assert again.names() == ["amy"] and again.get("amy")["transcript"] == "hi"
        await again.delete("amy")
        assert again.names() == [] and not (tmp_path / "amy").exists()
        with pytest.raises(VoiceNotFound):
            await again.delete("amy")

    run(main())


# -- two processes on one voices dir: two libraries, each with its own index ----------------------
def test_a_voice_registered_or_deleted_through_one_library_reaches_the_other_by_sync(tmp_path):
    async def main():
        pool = ThreadPool()
        a, b = VoiceLibrary(tmp_path), VoiceLibrary(tmp_path)
        await a.start(pool)
        await b.start(pool)
        await a.register(pool, "amy", "hi", "", audio(), b"x", "wav")
        assert b.names() == []
        assert await b.sync(pool) == {"added": ["amy"], "removed": []}
        assert b.get("amy")["transcript"] == "hi" and b.features("amy", "fake-1") is not None
        assert await b.sync(pool) == {"added": [], "removed": []}  # nothing changed: nothing read again
        await a.delete("amy")
        await a.register(pool, "amy", "hello again", "", audio(), b"y", "wav")  # same name, a new voice
        assert await b.sync(pool) == {"added": ["amy"], "removed": []}
        assert b.get("amy")["transcript"] == "hello again"
        await b.delete("amy")
        assert await a.sync(pool) == {"added": [], "removed": ["amy"]}
        assert a.names() == [] and a.features("amy", "fake-1") is None

    run(main())


def test_racing_registrations_in_two_libraries_one_wins_and_both_end_with_its_voice(tmp_path):
    async def main():
        pool = ThreadPool()
        a, b = VoiceLibrary(tmp_path), VoiceLibrary(tmp_path)
        await a.start(pool)
        await b.start(pool)
        results = await asyncio.gather(a.register(pool, "amy", "from a", "", audio(), b"a", "wav"),
                                       b.register(pool, "amy", "from b", "", audio(), b"b", "wav"),
                                       return_exceptions=True)
        won = [r for r in results if isinstance(r, dict)]
        assert len(won) == 1 and sum(isinstance(r, VoiceExists) for r in results) == 1
        await a.sync(pool)
        await b.sync(pool)
        assert a.get("amy") == b.get("amy") == won[0]

    run(main())


def test_the_watcher_picks_up_another_librarys_changes_within_a_second(tmp_path):
    async def main():
        pool = ThreadPool()
        a, b = VoiceLibrary(tmp_path), VoiceLibrary(tmp_path, sync_interval_s=0.05)
        await a.start(pool)
        await b.start(pool)
        try:
            await a.register(pool, "amy", "hi", "", audio(), b"x", "wav")
            await await_until(lambda: b.names() == ["amy"], timeout=1.0)
            await a.delete("amy")
            await await_until(lambda: b.names() == [], timeout=1.0)
        finally:
            await b.close()
        assert b._watcher is None

    run(main())


def test_a_sync_leaves_a_name_being_registered_here_to_the_local_registration(tmp_path):
    async def main():
        pool = ThreadPool()
        a, b = VoiceLibrary(tmp_path), VoiceLibrary(tmp_path)
        await a.start(pool)
        await b.start(pool)
        b._reserve("amy", pool)  # b is computing features for "amy" ...
        await a.register(pool, "amy", "from a", "", audio(), b"a", "wav")  # ... when a commits it
        assert (await b.sync(pool))["added"] == [] and b.names() == []
        b._release("amy")  # b's registration ends (its commit would get 409): the next sync takes a's
        assert (await b.sync(pool))["added"] == ["amy"]

    run(main())
