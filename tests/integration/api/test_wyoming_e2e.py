"""The Wyoming TTS service (Home Assistant) through the ``wyoming`` package's client, against a real server.

One fake-engine server for the module: one synthesis permit in all (one worker, no queue), every
fake chunk 0.3 s late, so a second request beside a running one is over capacity.
``describe`` lists the presets and a registered voice; ``synthesize`` speaks one text; the streamed
request speaks before its last chunk is sent and ends with ``synthesize-stopped``; refusals (over
capacity, too long, an unknown voice, the connection limit) are ``error`` events; the drain lets a
running request finish. The tiny-model module next to this one checks the audio itself.
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import psutil
import pytest
import yaml
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from tests.support.server import ServerProcess, fake_engine_config, free_port
from tests.support.sounds import prompt_wav
from tests.support.wyoming_client import Reply, next_event, read_reply

pytestmark = pytest.mark.e2e

RATE = 24000  # the fake engine's
SENTENCE_BYTES = 3 * round(0.2 * RATE) * 2  # the fake engine: 3 chunks of 0.2 s a sentence, s16le
CHUNK_DELAY_S = 0.3
MAX_TEXT = 200
MAX_CONNECTIONS = 3


def wyoming_server(tmp, **wyoming) -> ServerProcess:
    cfg = fake_engine_config(tmp, workers=1, max_queue=0)
    cfg["dev"]["fake_chunk_delay_s"] = CHUNK_DELAY_S
    cfg["server"]["max_text_chars"] = MAX_TEXT
    cfg["wyoming"] = {"port": free_port(), "max_sessions": MAX_CONNECTIONS, "samples_per_chunk": 1024, **wyoming}
    return ServerProcess(tmp, cfg)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with wyoming_server(tmp_path_factory.mktemp("wyoming-e2e")) as srv:
        r = httpx.post(srv.base_url + "/v1/voices", data={"name": "kitchen", "transcript": "A registered voice."},
                       files={"audio": ("kitchen.wav", prompt_wav(), "audio/wav")}, timeout=30)
        assert r.status_code == 201, r.text
        yield srv
        assert "Traceback" not in srv.log()


def port_of(srv: ServerProcess) -> int:
    return yaml.safe_load(srv.config_path.read_text())["wyoming"]["port"]


def connect(srv: ServerProcess) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", port_of(srv))


def metric(srv: ServerProcess, series: str) -> float:
    for line in httpx.get(srv.base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {series} series")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def check_audio(reply: Reply, sentences: int = 1) -> None:
    assert reply.types[0] == "audio-start" and reply.types[-1] in ("audio-stop", "synthesize-stopped")
    start = reply.start
    assert (start.rate, start.width, start.channels) == (RATE, 2, 1)
    assert all((c.rate, c.width, c.channels) == (RATE, 2, 1) for c in reply.chunks)
    assert all(len(c.audio) <= 1024 * 2 for c in reply.chunks)  # wyoming.samples_per_chunk
    assert len(reply.pcm) == sentences * SENTENCE_BYTES
    assert reply.error is None


def test_describe_lists_the_presets_and_the_library(server):
    async def go():
        async with connect(server) as c:
            await c.write_event(Describe().event())
            event = await next_event(c)
            assert Info.is_type(event.type)
            return Info.from_event(event)

    info = run(go())
    (program,) = info.tts
    assert program.supports_synthesize_streaming
    names = [v.name for v in program.voices]
    assert names == ["fake_female", "fake_male", "kitchen"]  # presets first: the default voice leads
    assert all(v.languages and "en" in v.languages for v in program.voices)


def test_synthesize_speaks_one_text_and_the_connection_takes_another(server):
    async def go():
        async with connect(server) as c:
            await c.write_event(Synthesize(text="Hello from the kitchen.").event())
            first = await read_reply(c)
            await c.write_event(Synthesize(text="Two sentences. With a voice.",
                                           voice=SynthesizeVoice(name="kitchen")).event())
            second = await read_reply(c)
            await c.write_event(Ping(text="still here").event())
            pong = await next_event(c)
            return first, second, pong

    first, second, pong = run(go())
    check_audio(first)
    check_audio(second, sentences=2)
    assert Pong.is_type(pong.type) and Pong.from_event(pong).text == "still here"


def test_streamed_text_is_spoken_before_its_last_chunk(server):
    async def go():
        async with connect(server) as c:
            await c.write_event(SynthesizeStart(voice=SynthesizeVoice(name="fake_male")).event())
            await c.write_event(SynthesizeChunk(text="The first sentence is ").event())
            await asyncio.sleep(0.2)
            await c.write_event(SynthesizeChunk(text="complete. The second").event())
            reply = Reply()
            sent_at = time.monotonic()
            while not any(AudioChunk.is_type(t) for t in reply.types):  # audio before the rest is sent
                reply.events.append(await next_event(c))
            first_audio_s = time.monotonic() - sent_at
            await c.write_event(SynthesizeChunk(text=" one arrives later.").event())
            # the whole text again, as Home Assistant sends it for servers that do not stream: ignored
            await c.write_event(Synthesize(text="The first sentence is complete. The second one arrives later.",
                                           voice=SynthesizeVoice(name="fake_male")).event())
            await c.write_event(SynthesizeStop().event())
            return await read_reply(c, streamed=True, reply=reply), first_audio_s

    reply, first_audio_s = run(go())
    assert first_audio_s < 30
    assert reply.types.count("audio-start") == 1 and reply.types.count("audio-stop") == 1
    assert reply.types[-2:] == ["audio-stop", "synthesize-stopped"]
    check_audio(Reply(reply.events[:-1]), sentences=2)


def test_a_request_over_capacity_gets_an_error_event_not_a_hang(server):
    series = 'tts_wyoming_syntheses_total{mode="synthesize",outcome="rejected"}'
    before = metric(server, series)

    async def go():
        async with connect(server) as busy, connect(server) as refused, connect(server) as streamed:
            await busy.write_event(Synthesize(text="This one holds the only permit.").event())
            started = await next_event(busy)
            assert AudioStart.is_type(started.type)  # it runs now
            await refused.write_event(Synthesize(text="No room for this one.").event())
            over = await read_reply(refused, streamed=False)
            closed = await refused.read_event()  # a one-text request's error closes: its client stops waiting
            await streamed.write_event(SynthesizeStart().event())
            await streamed.write_event(SynthesizeChunk(text="Nor for a streamed one.").event())
            await streamed.write_event(SynthesizeStop().event())
            over_streamed = await read_reply(streamed, streamed=True)
            done = await read_reply(busy, reply=Reply([started]))
            await streamed.write_event(Synthesize(text="Room again.").event())  # a streamed error keeps it open
            again = await read_reply(streamed)
            return over, closed, over_streamed, done, again

    over, closed, over_streamed, done, again = run(go())
    assert over.types == ["error"] and over.error.code == "overloaded" and closed is None
    assert over_streamed.types == ["error", "synthesize-stopped"] and over_streamed.error.code == "overloaded"
    check_audio(done)
    check_audio(again)
    assert metric(server, series) == before + 1


def test_bad_requests_get_error_events_and_a_one_text_request_closes(server):
    async def one(event):
        async with connect(server) as c:
            await c.write_event(event)
            reply = await read_reply(c)
            return reply, await c.read_event()

    async def go():
        replies = [await one(e) for e in (Synthesize(text="x" * (MAX_TEXT + 1)).event(),
                                          Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody")).event(),
                                          Synthesize(text="   ").event())]
        async with connect(server) as c:
            streamed = []
            await c.write_event(SynthesizeStart().event())
            await c.write_event(SynthesizeChunk(text="y" * MAX_TEXT).event())
            await c.write_event(SynthesizeChunk(text="one too many").event())
            await c.write_event(SynthesizeStop().event())
            streamed.append(await read_reply(c, streamed=True))
            await c.write_event(SynthesizeChunk(text="no stream is open").event())
            streamed.append(await read_reply(c))
            await c.write_event(Synthesize(text="Fine.").event())
            streamed.append(await read_reply(c))
        return replies, streamed

    (too_long, unknown, empty), (stream_too_long, no_stream, fine) = run(go())
    assert too_long[0].types == ["error"] and too_long[0].error.code == "text_too_long"
    assert unknown[0].types == ["error"] and "nobody" in unknown[0].error.text
    assert empty[0].types == ["error"] and empty[0].error.code == "empty_input"
    assert too_long[1] is None and unknown[1] is None and empty[1] is None  # each closed after its error
    assert stream_too_long.types == ["error", "synthesize-stopped"]
    assert stream_too_long.error.code == "text_too_long"
    assert no_stream.types == ["error"] and no_stream.error.code == "no_stream"
    check_audio(fine)


def test_the_connection_past_the_limit_is_refused(server):
    async def go():
        clients = [connect(server) for _ in range(MAX_CONNECTIONS)]
        for c in clients:
            await c.connect()
            await c.write_event(Describe().event())  # counted in once it answers
            assert Info.is_type((await next_event(c)).type)
        try:
            async with connect(server) as extra:
                refusal = await next_event(extra)
                closed = await asyncio.wait_for(extra.read_event(), 30)
        finally:
            for c in clients:
                await c.disconnect()
        return refusal, closed

    refusal, closed = run(go())
    assert Error.is_type(refusal.type) and Error.from_event(refusal).code == "session_limit"
    assert closed is None


def test_an_oversized_event_ends_the_connection(server):
    async def go():
        async with connect(server) as c:
            await c.write_event(Synthesize(text="z", context={"pad": "p" * 70_000}).event())
            first = await asyncio.wait_for(c.read_event(), 30)
            then = await asyncio.wait_for(c.read_event(), 30)
            return first, then

    first, then = run(go())
    assert first is not None and Error.is_type(first.type) and Error.from_event(first).code == "event_too_large"
    assert then is None


@pytest.mark.parametrize("line", [b"not json\n", b"[1, 2]\n", b'{"type": "synthesize", "data_length": "x"}\n',
                                  b'{"no": "type"}\n', b'{"type": "synthesize", "data": 5}\n'])
def test_a_line_that_is_no_event_gets_an_error_or_a_close(server, line):
    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(line)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readline(), 30)  # an error event's header, or closed
        writer.close()
        async with connect(server) as c:  # the server goes on
            await c.write_event(Describe().event())
            return answer, (await next_event(c)).type

    answer, then = run(go())
    assert then == "info"
    assert answer == b"" or b'"error"' in answer


def test_the_drain_lets_a_running_request_finish(tmp_path):
    with wyoming_server(tmp_path) as srv:
        async def go():
            async with connect(srv) as c:
                await c.write_event(Synthesize(text="Spoken to the end. While the server drains.").event())
                assert AudioStart.is_type((await next_event(c)).type)
                srv.signal(signal.SIGTERM)
                reply = await read_reply(c)
                after = await next_event(c)
                closed = await asyncio.wait_for(c.read_event(), 30)
                return reply, after, closed

        reply, after, closed = run(go())
        assert AudioStop.is_type(reply.events[-1].type)
        assert len(reply.pcm) == 2 * SENTENCE_BYTES
        assert Error.is_type(after.type) and Error.from_event(after).code == "draining"
        assert closed is None
        assert srv.wait(60) == 0
        assert "Traceback" not in srv.log()


def test_an_idle_connection_is_closed(tmp_path):
    srv = wyoming_server(tmp_path)
    cfg = yaml.safe_load(srv.config_path.read_text())
    cfg["websocket"] = {"idle_timeout_s": 1.0}  # the streaming surfaces' idle timeout
    srv.config_path.write_text(yaml.safe_dump(cfg))
    with srv:
        async def go():
            async with connect(srv) as c:
                await c.write_event(Describe().event())
                assert Info.is_type((await next_event(c)).type)  # describe keeps nothing alive
                started = time.monotonic()
                closed = await asyncio.wait_for(c.read_event(), 30)
                return closed, time.monotonic() - started

        closed, after_s = run(go())
    assert closed is None and after_s < 10


def test_off_unless_a_port_is_set(tmp_path):
    from app.settings import Settings
    from app.settings.runtime import wyoming_config

    assert wyoming_config(Settings(dev={"fake_engine": True})) is None
    cfg = wyoming_config(Settings(dev={"fake_engine": True}, server={"host": "10.0.0.5"}, wyoming={"port": 10200}))
    assert cfg is not None and (cfg.host, cfg.port) == ("10.0.0.5", 10200)
    config = fake_engine_config(tmp_path)
    config["server"]["log_level"] = "info"
    with ServerProcess(tmp_path, config) as srv:  # no wyoming section: the HTTP port is all it listens on
        listening = {c.laddr.port for c in psutil.Process(srv.proc.pid).net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN}
        assert listening == {srv.port}
        assert "Wyoming" not in srv.log()
