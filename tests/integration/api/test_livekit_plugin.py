"""Our LiveKit TTS plugin (``cosyserve_plugins.livekit``) through LiveKit's own stream classes, against a
real ``cosyserve serve`` on the fake engine.

The fake engine speaks streamed text a sentence at a time (3 chunks of 0.2 s of tone a sentence,
each after 0.2 s here: about real time), so a sentence's audio can only arrive before the last word
if the plugin sends each word as it is pushed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.metrics import metrics
from tests.support.server import ServerProcess, fake_engine_config, free_port
from tests.support.waiting import run, wait_until

pytestmark = pytest.mark.e2e

lk_agents = pytest.importorskip("livekit.agents")
plugin = pytest.importorskip("cosyserve_plugins.livekit")

SENTENCE_S = 3 * 0.2  # the fake engine's audio for one sentence
CHUNK_DELAY_S = 0.2
WORDS = "Hello there, agent. This answer is written word by word. And it ends right here.".split(" ")
NO_RETRY = lk_agents.APIConnectOptions(max_retry=0, timeout=5)
CANCELS = 'tts_ws_cancels_total{target="utterance"}'


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("livekit-plugin")
    config = fake_engine_config(tmp)
    config["dev"]["fake_chunk_delay_s"] = CHUNK_DELAY_S
    proc = ServerProcess(tmp, config).start(timeout=60)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()


def samples(frames) -> np.ndarray:
    return np.concatenate([np.frombuffer(f.data, dtype=np.int16) for f in frames])


def test_streamed_words_are_spoken_before_the_last_one_is_pushed(server):
    async def main():
        tts = plugin.TTS(base_url=server.base_url)
        stream = tts.stream(conn_options=NO_RETRY)
        events, arrived = [], []

        async def read():
            async for ev in stream:
                events.append(ev)
                arrived.append(time.monotonic())

        reader = asyncio.create_task(read())
        for i, word in enumerate(WORDS):
            stream.push_text(word if i == 0 else " " + word)
            await asyncio.sleep(0.15)  # an LLM writing about 7 words a second
        last_pushed = time.monotonic()
        stream.end_input()
        await reader
        await stream.aclose()
        await tts.aclose()
        return events, arrived, last_pushed

    events, arrived, last_pushed = run(main(), timeout=30)
    assert arrived and arrived[0] < last_pushed - 0.5, "no audio before the text was complete"
    frames = [ev.frame for ev in events]
    assert {f.sample_rate for f in frames} == {24000} and {f.num_channels for f in frames} == {1}
    pcm = samples(frames)
    assert abs(len(pcm) / 24000 - 3 * SENTENCE_S) < 0.01  # three sentences, every sample, nothing else
    assert np.abs(pcm.astype(np.int32)).max() > 3000  # the tone, not silence
    assert len({ev.segment_id for ev in events}) == 1 and events[-1].is_final and not events[0].is_final


@pytest.mark.parametrize("rate", [24000, 16000])
def test_synthesize_speaks_the_text_at_the_asked_rate(server, rate):
    async def main():
        async with plugin.TTS(base_url=server.base_url + "/v1", sample_rate=rate) as tts:
            return [ev.frame async for ev in tts.synthesize("One sentence.", conn_options=NO_RETRY)]

    frames = run(main(), timeout=20)
    assert {f.sample_rate for f in frames} == {rate}
    assert abs(len(samples(frames)) / rate - SENTENCE_S) < 0.01


def test_closing_a_stream_mid_utterance_cancels_it_and_keeps_the_socket(server):
    before = metrics(server).get(CANCELS, 0.0)

    async def main():
        tts = plugin.TTS(base_url=server.base_url)
        stream = tts.stream(conn_options=NO_RETRY)
        stream.push_text("A long sentence that the user is about to interrupt.")
        stream.flush()
        first = await anext(stream)  # the first 0.2 s chunk; two more are on their way
        await stream.aclose()  # what LiveKit does on barge-in
        await asyncio.to_thread(wait_until, lambda: metrics(server).get(CANCELS, 0.0) == before + 1)

        second = tts.stream(conn_options=NO_RETRY)
        second.push_text("Next turn.")
        second.end_input()
        frames = [ev.frame async for ev in second]
        reused = tts._pool.last_connection_reused
        await second.aclose()
        await tts.aclose()
        return first.frame, frames, reused

    first, frames, reused = run(main(), timeout=30)
    assert first.duration < SENTENCE_S
    assert reused, "the socket was not pooled again after audio.cancelled"
    # the next turn hears itself only: no frame of the cancelled utterance leaked into it
    assert abs(len(samples(frames)) / 24000 - SENTENCE_S) < 0.01


@pytest.mark.parametrize("streamed", [False, True], ids=["synthesize", "stream"])
def test_a_server_error_is_a_livekit_api_status_error(server, streamed):
    async def main():
        async with plugin.TTS(base_url=server.base_url, voice="nobody-here") as tts:
            if streamed:
                speech = tts.stream(conn_options=NO_RETRY)
                speech.push_text("Hello.")
                speech.end_input()
            else:
                speech = tts.synthesize("Hello.", conn_options=NO_RETRY)
            try:
                async for _ in speech:
                    pass
            finally:
                await speech.aclose()

    with pytest.raises(lk_agents.APIStatusError) as exc:
        run(main(), timeout=20)
    assert exc.value.status_code == 400 and not exc.value.retryable
    assert exc.value.body["error"]["code"] == "unknown_voice", exc.value.body


def test_no_server_is_a_livekit_api_connection_error():
    async def main():
        async with plugin.TTS(base_url=f"http://127.0.0.1:{free_port()}") as tts:
            await tts.synthesize("Hello.", conn_options=NO_RETRY).collect()

    with pytest.raises(lk_agents.APIConnectionError):
        run(main(), timeout=20)

