"""The one planning function: surface fields -> SynthesisRequest, the same for every surface."""

from __future__ import annotations

import numpy as np
import pytest

from app.engines.base import (
    MODES,
    PROMPT_MAX_S,
    PROMPT_MIN_S,
    SPEED_MAX,
    SPEED_MIN,
    EngineInfo,
    InvalidInput,
    PromptAudio,
    SynthesisRequest,
    check_mode_inputs,
)
from app.serving import bounds
from app.serving.errors import BadRequest
from app.serving.plan import OPENAI_VOICES, SpeechFields, alias_speaker, plan
from tests.support import configs

PRESETS = ("anna", "bob")
AUDIO = PromptAudio(np.zeros(16000 * 2, np.float32), 16000)


def info(modes=MODES) -> EngineInfo:
    return EngineInfo(name="m", family="fake", sample_rate=24000, modes=tuple(modes), voice_family="fake-1")


def make(fields: SpeechFields, modes=MODES, presets=PRESETS, library=("narrator",), limits=configs.speech_limits()):
    lib = {name: {"features": name} for name in library}
    return plan(fields, info(modes), presets, limits, lib.get, lambda: sorted(lib))


@pytest.mark.parametrize("fields, mode, speaker", [
    (SpeechFields(text="hi"), "sft", "anna"),
    (SpeechFields(text="hi", voice="bob"), "sft", "bob"),
    (SpeechFields(text="hi", instructions="calm"), "instruct", "anna"),
    (SpeechFields(text="hi", prompt_audio=AUDIO, prompt_text="p"), "zero_shot", None),
    (SpeechFields(text="hi", prompt_audio=AUDIO), "cross_lingual", None),
    (SpeechFields(text="hi", prompt_audio=AUDIO, instructions="fast"), "instruct2", None),
    (SpeechFields(text="hi", voice="narrator"), "zero_shot", None),
    (SpeechFields(text="hi", voice="narrator", instructions="sad"), "instruct2", None),
    (SpeechFields(text="hi", voice="narrator", mode="sft"), "zero_shot", None),
    (SpeechFields(text="hi", voice="narrator", mode="instruct", instructions="x"), "instruct2", None),
    (SpeechFields(text="hi", mode="vc", source_audio=AUDIO, prompt_audio=AUDIO), "vc", None),
])
def test_mode_and_speaker(fields, mode, speaker):
    req = make(fields).request
    assert (req.mode, req.speaker) == (mode, speaker)


def test_a_library_voice_wins_over_a_preset_and_carries_its_features():
    req = make(SpeechFields(text="hi", voice="bob"), library=("bob",)).request
    assert req.voice == {"features": "bob"} and req.speaker is None and req.mode == "zero_shot"


def test_instructions_the_model_cannot_use_are_dropped_and_reported():
    p = make(SpeechFields(text="hi", voice="bob", instructions="calm"), modes=("sft", "zero_shot"))
    assert (p.request.mode, p.request.instruct_text, p.instructions_ignored) == ("sft", None, True)
    p = make(SpeechFields(text="hi", voice="narrator", mode="instruct", instructions="x"), modes=("sft", "zero_shot"))
    assert (p.request.mode, p.instructions_ignored) == ("zero_shot", True)
    p = make(SpeechFields(text="hi", instructions="  "))
    assert (p.request.mode, p.instructions_ignored) == ("sft", False)


def test_openai_aliases_only_when_asked():
    assert make(SpeechFields(text="hi", voice="ash", aliases=True)).request.speaker == alias_speaker("ash", PRESETS)
    assert alias_speaker("alloy", PRESETS) == "anna" and alias_speaker("ash", PRESETS) == "bob"
    with pytest.raises(BadRequest) as err:
        make(SpeechFields(text="hi", voice="ash"))
    assert (err.value.code, err.value.param) == ("unknown_voice", "voice")
    assert "anna, bob, narrator" in err.value.message


def test_openai_alias_without_presets_says_why():
    with pytest.raises(BadRequest, match="OpenAI voice name") as err:
        make(SpeechFields(text="hi", voice=OPENAI_VOICES[0], aliases=True), presets=())
    assert err.value.code == "unknown_voice"


def test_no_presets_and_no_voice_is_voice_required():
    with pytest.raises(BadRequest) as err:
        make(SpeechFields(text="hi"), presets=())
    assert err.value.code == "voice_required"


@pytest.mark.parametrize("fields, code, param", [
    (SpeechFields(text="x" * 11), "text_too_long", "text"),
    (SpeechFields(text="x" * 11, text_param="tts_text"), "text_too_long", "tts_text"),
    (SpeechFields(text="hi", speed=5.0), "invalid_speed", "speed"),
    (SpeechFields(text="hi", speed=0.1), "invalid_speed", "speed"),
])
def test_limits(fields, code, param):
    with pytest.raises(BadRequest) as err:
        make(fields, limits=configs.speech_limits(max_text_chars=10))
    assert (err.value.code, err.value.param) == (code, param)


def test_speed_stream_and_texts_pass_through():
    req = make(SpeechFields(text="hello", speed=1.5, stream=True, prompt_audio=AUDIO, prompt_text="p")).request
    assert (req.text, req.speed, req.stream, req.prompt_text, req.prompt_audio) == ("hello", 1.5, True, "p", AUDIO)


@pytest.mark.parametrize("speed, ok", [(SPEED_MIN, True), (SPEED_MAX, True), (SPEED_MIN - 0.01, False),
                                       (SPEED_MAX + 0.01, False)])
def test_the_planner_and_the_engine_contract_share_one_speed_range(speed, ok):
    fields = SpeechFields(text="hi", speed=speed)
    if not ok:
        with pytest.raises(BadRequest):
            make(fields)
        with pytest.raises(InvalidInput, match="speed"):
            check_mode_inputs(SynthesisRequest(text="hi", speaker="anna", speed=speed), MODES, PRESETS)
        return
    req = make(fields).request
    check_mode_inputs(req, MODES, PRESETS)  # accepted by both
    assert (bounds.SPEED_MIN, bounds.SPEED_MAX, bounds.PROMPT_MIN_S, bounds.PROMPT_MAX_S) == (
        SPEED_MIN, SPEED_MAX, PROMPT_MIN_S, PROMPT_MAX_S)


def test_first_chunk_tokens_are_checked_against_the_models_range():
    ranged = EngineInfo(name="m", family="cosyvoice2", sample_rate=24000, modes=MODES, first_chunk_tokens=(5, 100))
    ok = plan(SpeechFields(text="hi", stream=True, first_chunk_tokens=5), ranged, PRESETS, configs.speech_limits())
    assert ok.request.first_chunk_tokens == 5 and ok.request.stream
    assert plan(SpeechFields(text="hi"), ranged, PRESETS, configs.speech_limits()).request.first_chunk_tokens is None
    for fields, why in ((SpeechFields(text="hi", stream=True, first_chunk_tokens=4), "between 5 and 100"),
                        (SpeechFields(text="hi", stream=True, first_chunk_tokens=101), "between 5 and 100"),
                        (SpeechFields(text="hi", first_chunk_tokens=10), "stream: true")):
        with pytest.raises(BadRequest) as exc:
            plan(fields, ranged, PRESETS, configs.speech_limits())
        assert exc.value.code == "invalid_first_chunk_tokens" and exc.value.param == "first_chunk_tokens"
        assert why in exc.value.message
    with pytest.raises(BadRequest, match="cannot change its first chunk"):  # v1, or no batching: no range
        plan(SpeechFields(text="hi", stream=True, first_chunk_tokens=10), info(), PRESETS, configs.speech_limits())
