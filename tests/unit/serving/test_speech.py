"""SpeechService over the real pool and FakeEngines: encode in the slot thread, disconnects, leaks."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app.audio.encode import make_encoder
from app.engines.fake import FakeBehaviour, FakeEngine
from app.serving import EnginePool
from app.serving.errors import ClientGone
from app.serving.plan import SpeechFields
from app.serving.speech import SpeechService
from tests.support import configs
from tests.support.pool import admitted_run
from tests.support.waiting import await_until, run


async def started(b: FakeBehaviour | None = None, encoder_factory=None, **cfg) -> tuple[SpeechService, FakeBehaviour]:
    b = b or FakeBehaviour()
    pool = EnginePool(lambda i: FakeEngine(b), configs.pool(**{"workers": 1, "max_queue": 2, **cfg}))
    await pool.start()
    return SpeechService(pool, configs.speech_limits(), encoder_factory=encoder_factory), b


def idle(service: SpeechService) -> bool:
    s = service.pool.stats()
    return s["in_flight"] == 0 and s["running"] == 0 and [x["state"] for x in s["slots"]] == ["idle"]


def test_whole_file_is_encoded_in_the_slot_thread():
    threads: list[str] = []

    def factory(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return make_encoder(*args, **kwargs)

    async def main():
        service, b = await started(encoder_factory=factory)
        try:
            p = service.plan(SpeechFields(text="hi"), "r1")
            result = await admitted_run(service, p, service.output("mp3", stream=False))
            assert result.media_type == "audio/mpeg" and result.sample_rate == 24000
            assert result.data[:1] == b"\xff"  # an mp3 frame, no ID3 tag
            assert result.audio_s == pytest.approx(b.chunks * b.chunk_s)
            assert idle(service)
        finally:
            await service.pool.close()

    run(main())
    assert threads and all(t.startswith("cosyserve-slot-") for t in threads)


def test_a_stream_yields_bytes_and_closing_it_frees_the_slot():
    async def main():
        service, b = await started()
        try:
            b.chunks = 4
            result = await admitted_run(service, service.plan(SpeechFields(text="hi")), service.output("pcm", stream=True))
            data = b"".join([part async for part in result.body])
            await result.aclose()
            assert len(data) == 2 * 4 * int(b.chunk_s * 24000)
            assert idle(service)
        finally:
            await service.pool.close()

    run(main())


def test_an_encoder_that_fails_to_open_closes_the_job_and_frees_slot_and_permit():
    def broken(*args, **kwargs):
        raise RuntimeError("codec went away")

    async def main():
        service, b = await started(encoder_factory=broken, request_timeout_s=0)
        try:
            with pytest.raises(RuntimeError, match="codec went away"):
                await admitted_run(service, service.plan(SpeechFields(text="hi")), service.output("mp3", stream=True))
            await await_until(lambda: idle(service))  # no deadline configured: only a closed job frees it
            assert b.finished == [] and len(b.cancelled) + len(b.started) >= 1
        finally:
            await service.pool.close()

    run(main())


def test_a_client_gone_while_queued_leaves_the_queue_without_engine_work():
    async def main():
        b = FakeBehaviour(gate=threading.Event())
        service, _ = await started(b)
        try:
            first = asyncio.ensure_future(admitted_run(service, service.plan(SpeechFields(text="a"), "held"),
                                                      service.output("wav", stream=False)))
            await await_until(lambda: b.started == ["held"])
            gone = asyncio.Event()
            queued = asyncio.ensure_future(admitted_run(service, service.plan(SpeechFields(text="b"), "leaver"),
                                                       service.output("wav", stream=False), gone=gone))
            await await_until(lambda: service.pool.stats()["queued"] == 1)
            gone.set()
            with pytest.raises(ClientGone):
                await queued
            s = service.pool.stats()
            assert (s["queued"], s["in_flight"]) == (0, 1)  # its permit is back at once
            b.gate.set()
            await first
            await await_until(lambda: idle(service))
            assert b.started == ["held"]  # the leaver never reached the engine
        finally:
            b.gate.set()
            await service.pool.close()

    run(main())


def test_a_client_gone_while_its_whole_file_runs_cancels_the_engine_job():
    async def main():
        b = FakeBehaviour(chunks=50, chunk_delay_s=0.05)
        service, _ = await started(b)
        try:
            gone = asyncio.Event()
            task = asyncio.ensure_future(admitted_run(service, service.plan(SpeechFields(text="long"), "leaver"),
                                                     service.output("wav", stream=False), gone=gone))
            await await_until(lambda: b.started == ["leaver"])
            gone.set()
            t0 = time.monotonic()
            with pytest.raises(ClientGone):
                await task
            assert time.monotonic() - t0 < 1.0  # within about one chunk, not the 2.5 s job
            assert b.cancelled == ["leaver"] and b.finished == []
            assert idle(service)
        finally:
            await service.pool.close()

    run(main())


def test_backpressure_counts_bytes():
    async def main():
        b = FakeBehaviour(chunks=8, chunk_s=1.0)  # 48 kB of pcm per chunk
        service, _ = await started(b, stream_buffer_chunks=100, stream_buffer_bytes=60_000)
        try:
            result = await admitted_run(service, service.plan(SpeechFields(text="x")), service.output("pcm", stream=True))
            stream = result.job.stream
            await await_until(lambda: stream.produced >= 3)
            for _ in range(20):  # let the producer run ahead as far as it may
                await asyncio.sleep(0.005)
            assert stream.buffered <= 2 and stream.max_buffered_bytes <= 60_000 + 48_000
            data = b"".join([part async for part in result.body])
            await result.aclose()
            assert len(data) == 8 * 2 * 24000
        finally:
            await service.pool.close()

    run(main())


class InfoCountingEngine(FakeEngine):
    """Records the thread of every info() / voices() call."""

    calls: list[str] = []

    def info(self):
        self.calls.append("info:" + threading.current_thread().name)
        return super().info()

    def voices(self):
        self.calls.append("voices:" + threading.current_thread().name)
        return super().voices()


def test_engine_info_is_read_once_at_load_in_the_slot_thread():
    async def main():
        calls: list[str] = []
        InfoCountingEngine.calls = calls
        pool = EnginePool(lambda i: InfoCountingEngine(), configs.pool(workers=2))
        await pool.start()
        service = SpeechService(pool, configs.speech_limits())
        try:
            assert sorted(calls) == sorted(f"{what}:cosyserve-slot-{i}" for what in ("info", "voices")
                                           for i in range(2))  # once per loaded engine, in its own thread
            assert service.info.family == "fake" and service.presets == ("fake_female", "fake_male")
            for _ in range(3):
                r = await admitted_run(service, service.plan(SpeechFields(text="hi")), service.output("wav", stream=False))
                assert r.data[:4] == b"RIFF"
            assert len(calls) == 4  # nothing engine-side on the event loop afterwards
        finally:
            await pool.close()

    run(main())
