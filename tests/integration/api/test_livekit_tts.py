"""LiveKit Agents' own OpenAI TTS (``livekit-plugins-openai``) against a real ``cosyserve serve`` (fake engine).

What a LiveKit voice agent does with ``openai.TTS(base_url=...)`` and no other flag: ``tts-1``
asks for raw audio (``stream_format: audio``), any other model name for SSE; the default
``response_format`` is mp3, decoded by LiveKit's own decoder into 24 kHz frames.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.server import ServerProcess, fake_engine_config

pytestmark = pytest.mark.e2e

lk_openai = pytest.importorskip("livekit.plugins.openai")

SECONDS = 3 * 0.2  # FakeBehaviour default: 3 chunks of 0.2 s of tone


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("livekit")
    proc = ServerProcess(tmp, fake_engine_config(tmp)).start(timeout=60)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()


def speak(base_url: str, model: str, **options) -> tuple[np.ndarray, int]:
    """The samples and rate of the frames LiveKit's ChunkedStream hands an agent."""
    async def main() -> tuple[list, int]:
        tts = lk_openai.TTS(base_url=f"{base_url}/v1", api_key="x", model=model, voice="alloy", **options)
        try:
            frames = [event.frame async for event in tts.synthesize("Hello from a LiveKit agent.")]
        finally:
            await tts.aclose()
        assert frames, "no audio frames"
        return frames, frames[0].sample_rate

    frames, rate = asyncio.run(main())
    samples = np.concatenate([np.frombuffer(f.data, dtype=np.int16) for f in frames])
    return samples, rate


@pytest.mark.parametrize("model", ["tts-1", "gpt-4o-mini-tts"], ids=["raw", "sse"])
def test_livekit_openai_tts_with_its_defaults(server, model):
    samples, rate = speak(server.base_url, model)
    assert rate == 24000
    assert abs(len(samples) / rate - SECONDS) < 0.08  # mp3 adds encoder padding, nothing more
    assert np.abs(samples.astype(np.int32)).max() > 3000  # the tone, decoded, not silence


def test_livekit_openai_tts_pcm(server):
    samples, rate = speak(server.base_url, "tts-1", response_format="pcm")
    sent = round(SECONDS * rate)
    assert rate == 24000 and sent <= len(samples) < sent + rate // 50  # every sample; LiveKit pads its last frame
    assert not samples[sent:].any() and np.abs(samples[:sent].astype(np.int32)).max() > 3000
