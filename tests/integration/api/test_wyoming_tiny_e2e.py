"""The Wyoming service on the tiny random-weight CosyVoice2: the PCM it sends is the model's audio.

The tiny model speaks noise, not words, so the checks are on the signal: s16le at the model's
rate, not silent, and a length that grows with the text, for one text and for text streamed in.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from tests.support.server import ServerProcess, free_port
from tests.support.wyoming_client import Reply, next_event, read_reply

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wyoming-tiny-e2e")
    port = free_port()
    cfg = {"engine": {"model_dir": str(tiny_models(2)), "torch_threads": 1},
           "pool": {"workers": 2, "max_queue": 2, "request_timeout_s": 120},
           "server": {"drain_timeout_s": 10}, "voices": {"dir": str(tmp / "voices")},
           "wyoming": {"port": port}}
    with ServerProcess(tmp, cfg) as srv:
        srv.wyoming_port = port
        yield srv


def samples(reply: Reply) -> np.ndarray:
    return np.frombuffer(reply.pcm, dtype="<i2").astype(np.float32) / 32768.0


def check_speech(reply: Reply, rate: int) -> float:
    """The reply's seconds of audio, after checking that it is the model's, not silence."""
    assert reply.error is None, reply.error
    start = reply.start
    assert (start.rate, start.width, start.channels) == (rate, 2, 1)
    assert len(reply.pcm) % 2 == 0
    audio = samples(reply)
    seconds = len(audio) / rate
    assert 0.2 < seconds < 60
    assert np.sqrt(np.mean(audio ** 2)) > 1e-3  # not silence
    assert np.abs(audio).max() <= 1.0
    return seconds


def test_one_text_and_a_streamed_one_are_the_models_audio(server):
    async def go():
        async with AsyncTcpClient("127.0.0.1", server.wyoming_port) as c:
            await c.write_event(Describe().event())
            info = Info.from_event(await next_event(c))
            await c.write_event(Synthesize(text="Hello from Home Assistant.").event())
            short = await read_reply(c, reply=Reply())
            await c.write_event(SynthesizeStart().event())
            for piece in ("The kitchen lights are on. ", "The front door is locked, ", "and it is raining."):
                await c.write_event(SynthesizeChunk(text=piece).event())
                await asyncio.sleep(0.1)
            await c.write_event(SynthesizeStop().event())
            streamed = await read_reply(c, streamed=True)
            return info, short, streamed

    info, short, streamed = asyncio.run(asyncio.wait_for(go(), 300))
    (program,) = info.tts
    assert program.voices and all(set(v.languages) >= {"zh", "en", "ja", "ko", "yue"} for v in program.voices)
    rate = short.start.rate
    assert rate == 24000  # CosyVoice2's native rate
    assert streamed.types[-2:] == ["audio-stop", "synthesize-stopped"]
    assert check_speech(streamed, rate) > 0.2
    assert check_speech(short, rate) > 0.2
