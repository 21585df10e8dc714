"""The official ``openai`` SDK against a real ``cosyserve serve`` process (fake engine).

One server for the whole module; every response format through ``create``, the
streaming-response API and the async client, SSE, and an SDK error.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from tests.support.decoding import FORMATS, check_audio
from tests.support.server import ServerProcess, fake_engine_config
from tests.support.sounds import prompt_wav
from tests.support.sse import parse_sse, sse_audio

pytestmark = pytest.mark.e2e

RATE = 24000  # the fake engine's default
SECONDS = 3 * 0.2  # FakeBehaviour default: 3 chunks of 0.2 s
MODEL = "gpt-4o-mini-tts"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("openai-sdk")
    proc = ServerProcess(tmp, fake_engine_config(tmp)).start(timeout=60)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module")
def client(server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=30) as c:
        yield c


@pytest.mark.parametrize("fmt", FORMATS)
def test_create_every_format(client, fmt):
    response = client.audio.speech.create(model=MODEL, voice="alloy", input="Hello from the SDK.",
                                          response_format=fmt)
    check_audio(response.content, fmt, RATE, SECONDS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_streaming_response_every_format(client, fmt):
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, voice={"id": "fake_male"}, input="Streaming.", response_format=fmt,
    ) as response:
        assert response.http_request.url.path == "/v1/audio/speech"
        parts = list(response.iter_bytes())
    assert parts
    check_audio(b"".join(parts), fmt, RATE, SECONDS)


def test_async_client_all_formats_concurrently(server):
    async def run() -> list[bytes]:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as aclient:
            async def one(fmt: str) -> bytes:
                async with aclient.audio.speech.with_streaming_response.create(
                    model="tts-1", voice="nova", input="Async.", response_format=fmt,
                ) as response:
                    return b"".join([part async for part in response.iter_bytes()])

            return await asyncio.gather(*(one(f) for f in FORMATS))

    for fmt, data in zip(FORMATS, asyncio.run(run())):
        check_audio(data, fmt, RATE, SECONDS)


def test_sse_stream_format(client, server):
    if "stream_format" in inspect.signature(client.audio.speech.create).parameters:
        text = client.audio.speech.create(model=MODEL, voice="alloy", input="Events.", response_format="pcm",
                                          stream_format="sse").text
    else:  # an SDK without the parameter: the same request over plain HTTP
        text = httpx.post(f"{server.base_url}/v1/audio/speech", timeout=30, json={
            "model": MODEL, "voice": "alloy", "input": "Events.", "response_format": "pcm", "stream_format": "sse",
        }).text
    events = parse_sse(text)
    check_audio(sse_audio(events), "pcm", RATE, SECONDS)
    assert events[-1]["usage"]["output_tokens"] == round(SECONDS * 25)


def test_models_and_voices(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake"]
    assert client.models.retrieve("tts-1").id == "tts-1"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("dall-e-3")


def test_sdk_errors(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model=MODEL, voice="nobody", input="hi")
    assert "unknown voice 'nobody'" in info.value.message
    assert info.value.body["param"] == "voice" and info.value.body["code"] == "unknown_voice"
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.speech.create(model="tts-2", voice="alloy", input="hi")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model=MODEL, voice="alloy", input="hi", speed=9)
    assert info.value.body["param"] == "speed"


def test_upstream_client_requests_get_with_form_body(server, tmp_path):
    """Upstream's fastapi/client.py, verbatim in spirit: GET with a form body, stream=True."""
    requests = pytest.importorskip("requests")
    wav = tmp_path / "prompt.wav"
    wav.write_bytes(prompt_wav(2.0))
    url = f"{server.base_url}/inference_zero_shot"
    payload = {"tts_text": "你好", "prompt_text": "希望你以后能够做的比我还好呦。"}
    with open(wav, "rb") as f:
        files = [("prompt_wav", ("prompt_wav", f, "application/octet-stream"))]
        response = requests.request("GET", url, data=payload, files=files, stream=True, timeout=30)
        tts_audio = b"".join(response.iter_content(chunk_size=16000))
    assert response.status_code == 200 and response.headers["X-Sample-Rate"] == str(RATE)
    speech = np.frombuffer(tts_audio, dtype=np.int16)
    assert len(speech) == round(SECONDS * RATE)
    response = requests.request("GET", f"{server.base_url}/inference_sft",
                                data={"tts_text": "hi", "spk_id": "fake_female"}, stream=True, timeout=30)
    assert response.status_code == 200 and len(response.content) == 2 * round(SECONDS * RATE)
