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
from tests.waiting import run


class ThreadPool:
    """The part of EnginePool the library uses; engine calls run in a worker thread."""

    def __init__(self) -> None:
        self.engine = FakeEngine(FakeBehaviour())

    def engine_info(self):
        return self.engine.info()

    def voices(self):
        return self.engine.voices()

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
