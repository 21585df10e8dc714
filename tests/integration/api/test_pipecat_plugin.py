"""Our Pipecat TTS service (``cosyserve_plugins.pipecat``) through Pipecat's own test harness
(``pipecat.tests.utils.run_test``) against a real ``cosyserve serve`` on the fake engine.

The fake engine speaks streamed text a sentence at a time (3 chunks of 0.2 s of tone a sentence,
each after 0.2 s here: about real time).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

from tests.support.metrics import metrics
from tests.support.server import ServerProcess, fake_engine_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

frames = pytest.importorskip("pipecat.frames.frames")
plugin = pytest.importorskip("cosyserve_plugins.pipecat")
from pipecat.observers.base_observer import BaseObserver, FramePushed  # noqa: E402
from pipecat.tests.utils import SleepFrame, run_test  # noqa: E402

SENTENCE_S = 3 * 0.2
WORDS = "Hello there, agent. This answer is written word by word. And it ends right here.".split(" ")
CANCELS = 'tts_ws_cancels_total{target="utterance"}'


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("pipecat-plugin")
    config = fake_engine_config(tmp)
    config["dev"]["fake_chunk_delay_s"] = 0.2
    proc = ServerProcess(tmp, config).start(timeout=60)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()


class Arrivals(BaseObserver):
    """When the service received each LLM token and pushed each audio frame."""

    def __init__(self, tts) -> None:
        super().__init__()
        self.tts, self.text_in, self.audio_out = tts, [], []

    async def on_push_frame(self, data: FramePushed) -> None:
        if data.destination is self.tts and isinstance(data.frame, frames.LLMTextFrame):
            self.text_in.append(time.monotonic())
        elif data.source is self.tts and isinstance(data.frame, frames.TTSAudioRawFrame):
            self.audio_out.append(time.monotonic())


def turn(*texts: str, pace_s: float = 0.0) -> list:
    out: list = [frames.LLMFullResponseStartFrame()]
    for text in texts:
        out += [frames.LLMTextFrame(text)] + ([SleepFrame(sleep=pace_s)] if pace_s else [])
    return out + [frames.LLMFullResponseEndFrame()]


def audio_by_context(down) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for f in down:
        if isinstance(f, frames.TTSAudioRawFrame):
            assert f.sample_rate == 24000 and f.num_channels == 1
            seconds[f.context_id] += len(f.audio) / 2 / f.sample_rate
    return dict(seconds)


def test_tokens_are_spoken_while_the_turn_is_written(server):
    tts = plugin.CosyserveTTSService(base_url=server.base_url)
    seen = Arrivals(tts)
    words = [w if i == 0 else " " + w for i, w in enumerate(WORDS)]
    down, up = asyncio.run(run_test(tts, frames_to_send=[*turn(*words, pace_s=0.15), SleepFrame(sleep=1.5)],
                                    observers=[seen]))
    assert not [f for f in up if isinstance(f, frames.ErrorFrame)], up
    assert seen.audio_out and seen.audio_out[0] < seen.text_in[-1] - 0.5, "no audio before the last token"
    spoken = audio_by_context(down)
    assert len(spoken) == 1 and abs(next(iter(spoken.values())) - 3 * SENTENCE_S) < 0.01, spoken
    kinds = [type(f) for f in down]
    assert kinds.index(frames.TTSStartedFrame) < kinds.index(frames.TTSAudioRawFrame)
    assert frames.TTSStoppedFrame in kinds


def test_an_interruption_cancels_the_turn_and_keeps_the_socket(server):
    before = metrics(server).get(CANCELS, 0.0)
    tts = plugin.CosyserveTTSService(base_url=server.base_url)
    down, up = asyncio.run(run_test(tts, frames_to_send=[
        *turn("A long sentence that the user is about to interrupt."), SleepFrame(sleep=0.45),
        frames.InterruptionFrame(), SleepFrame(sleep=0.6),
        *turn("Next turn."), SleepFrame(sleep=1.2)]))
    assert not [f for f in up if isinstance(f, frames.ErrorFrame)], up
    wait_until(lambda: metrics(server).get(CANCELS, 0.0) == before + 1)
    spoken = list(audio_by_context(down).values())
    assert len(spoken) == 2, spoken
    assert 0 < spoken[0] < SENTENCE_S  # cut short
    assert abs(spoken[1] - SENTENCE_S) < 0.01  # the next turn, whole, and nothing of the cancelled one


def test_an_unknown_voice_is_an_error_frame_and_no_audio(server):
    tts = plugin.CosyserveTTSService(base_url=server.base_url, voice="nobody-here")
    down, up = asyncio.run(run_test(tts, frames_to_send=[SleepFrame(sleep=0.3), *turn("Hello."),
                                                         SleepFrame(sleep=0.8)]))
    errors = [f.error for f in up if isinstance(f, frames.ErrorFrame)]
    assert errors and "unknown_voice" in errors[0], errors
    assert not audio_by_context(down)


def test_pipecats_own_openai_tts_service_speaks_each_sentence(server):
    """The stock ``OpenAITTSService`` (what a Pipecat agent uses without our service): unchanged, on the
    OpenAI route, a sentence at a time."""
    from openai import DefaultAsyncHttpxClient
    from pipecat.services.openai.tts import OpenAITTSService

    async def run():
        async with DefaultAsyncHttpxClient() as http:  # the service never closes the client it is given
            tts = OpenAITTSService(api_key="unused", base_url=server.base_url + "/v1", sample_rate=24000,
                                   http_client=http)
            return await run_test(tts, frames_to_send=[*turn("Hello there, agent.", " Two sentences now."),
                                                      SleepFrame(sleep=1.5)])

    down, up = asyncio.run(run())
    assert not [f for f in up if isinstance(f, frames.ErrorFrame)], up
    spoken = sum(audio_by_context(down).values())
    assert abs(spoken - 2 * SENTENCE_S) < 0.05, spoken  # both sentences, each the fake engine's 3 chunks
