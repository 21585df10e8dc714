"""The voice library end to end: a real ``cosyserve serve`` with the tiny real CosyVoice2 model.

Register a voice, synthesise with it, restart the server over the same voices
dir, and the voice is still there and still speaks; then delete it.
"""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest
import soundfile as sf

from tests.support.server import ServerProcess
from tests.support.sounds import voice_wav

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

TEXT = "Hello there, this is a registered voice speaking."


@pytest.fixture(scope="module")
def tiny_v2(tiny_models) -> Path:
    return tiny_models(2)


def speak(http: httpx.Client, voice: str) -> float:
    r = http.post("/v1/tts", json={"text": TEXT, "voice": voice})
    assert r.status_code == 200, r.text
    audio, rate = sf.read(io.BytesIO(r.content), dtype="int16")
    assert rate == 24000
    assert len(audio) > 0
    return len(audio) / rate


def serve(tmp: Path, model_dir: Path, voices: Path) -> ServerProcess:
    tmp.mkdir()
    config = {"engine": {"model_dir": str(model_dir), "torch_threads": 1}, "pool": {"workers": 1},
              "server": {"drain_timeout_s": 10}, "voices": {"dir": str(voices)}}
    return ServerProcess(tmp, config).start(timeout=300)


def test_register_speak_restart_speak_delete(tmp_path, tiny_v2):
    voices = tmp_path / "voices"
    first = serve(tmp_path / "first", tiny_v2, voices)
    try:
        with httpx.Client(base_url=first.base_url, timeout=120) as http:
            r = http.post("/v1/voices", data={"name": "narrator", "transcript": "hello there, this is my voice"},
                          files={"audio": ("narrator.wav", voice_wav(), "audio/wav")})
            assert r.status_code == 201, r.text
            card = r.json()
            assert card["name"] == "narrator" and abs(card["duration_s"] - 3.0) < 0.01
            assert speak(http, "narrator") > 0
            r = http.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "narrator",
                                                    "response_format": "wav"})
            assert r.status_code == 200, r.text
            assert sf.info(io.BytesIO(r.content)).samplerate == 24000
            assert http.post("/v1/voices", data={"name": "narrator", "transcript": "again"},
                             files={"audio": ("n.wav", voice_wav(), "audio/wav")}).status_code == 409
    finally:
        assert first.stop() == 0, first.log()
    families = [p.name for p in (voices / "narrator" / "features").iterdir()]
    assert len(families) == 1 and families[0].startswith("cosyvoice2-")

    second = serve(tmp_path / "second", tiny_v2, voices)
    try:
        with httpx.Client(base_url=second.base_url, timeout=120) as http:
            assert http.get("/v1/voices").json() == {"voices": [card]}
            assert speak(http, "narrator") > 0
            assert http.delete("/v1/voices/narrator").status_code == 204
            r = http.get("/v1/voices/narrator")
            assert r.status_code == 404 and r.json()["error"]["code"] == "voice_not_found"
            assert http.post("/v1/tts", json={"text": TEXT, "voice": "narrator"}).status_code == 400
    finally:
        assert second.stop() == 0, second.log()
    assert "1 voice(s) loaded" in second.log()
    assert "from its stored prompt" not in second.log()  # imported, not recomputed
    assert list(voices.iterdir()) == []
