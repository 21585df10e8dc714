"""CosyVoiceEngine's voice features on the tiny real CosyVoice2 model, in process.

A registered voice (compute once, export, import) speaks exactly like the inline
prompt it came from, and a repeated inline prompt hits the prompt cache.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from app.engines.base import InvalidInput, PromptAudio, SynthesisRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXT = "Hello there, this is a registered voice speaking."
TRANSCRIPT = "hello there, this is my voice"


@pytest.fixture(scope="module")
def engine(engines):
    return engines(2)


def prompt(seconds: float = 3.0) -> PromptAudio:
    t = np.arange(int(seconds * 16000)) / 16000
    return PromptAudio((0.25 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 16000)


def speak(engine, **fields) -> np.ndarray:
    import torch

    torch.manual_seed(0)
    req = SynthesisRequest(text=TEXT, mode="zero_shot", **fields)
    return np.concatenate([c.pcm for c in engine.synthesize(req, threading.Event())])


def test_imported_voice_speaks_like_its_inline_prompt(engine):
    voice = engine.compute_voice(TRANSCRIPT, prompt())
    imported = engine.import_voice(engine.export_voice(voice))
    assert imported.family == voice.family == engine.info().voice_family
    assert imported.prompt_text == TRANSCRIPT
    assert set(imported.features) == set(voice.features)
    for key, value in voice.features.items():
        assert np.array_equal(imported.features[key].cpu().numpy(), value.cpu().numpy()), key
    inline = speak(engine, prompt_text=TRANSCRIPT, prompt_audio=prompt())
    registered = speak(engine, voice=imported)
    assert len(registered) > 0
    assert np.array_equal(inline, registered)


def test_a_repeated_inline_prompt_is_not_recomputed(engine):
    engine.prompts.clear()
    hits = engine.prompts.hits
    audio = prompt(2.5)
    speak(engine, prompt_text=TRANSCRIPT, prompt_audio=audio)
    assert engine.prompts.hits == hits
    speak(engine, prompt_text=TRANSCRIPT, prompt_audio=PromptAudio(audio.samples.copy(), 16000))
    assert engine.prompts.hits == hits + 1


def test_a_voice_from_another_family_is_refused(engine):
    voice = engine.compute_voice(TRANSCRIPT, prompt())
    alien = dataclasses.replace(voice, family="cosyvoice2-000000000000")
    with pytest.raises(InvalidInput, match="voice was made for"):
        speak(engine, voice=alien)
