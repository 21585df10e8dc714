"""The engine contract and the fake engine, without torch."""

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from app.engines.base import (
    AudioChunk,
    Engine,
    EngineFailure,
    InvalidInput,
    PromptAudio,
    SynthesisRequest,
    check_mode_inputs,
    float_to_int16,
)
from app.engines.fake import FakeBehaviour, FakeEngine

SPK = ["a", "b"]
ALL = ("sft", "zero_shot", "cross_lingual", "instruct", "instruct2", "vc")


def prompt(seconds: float) -> PromptAudio:
    return PromptAudio(np.zeros(int(16000 * seconds), dtype=np.float32), 16000)


@pytest.mark.parametrize(
    "req, message",
    [
        (SynthesisRequest(text="", speaker="a"), "text is empty"),
        (SynthesisRequest(text="hi", speaker="zz"), "unknown speaker 'zz'; known speakers: a, b"),
        (SynthesisRequest(text="hi"), "needs a preset 'speaker'"),
        (SynthesisRequest(text="hi", mode="zero_shot", prompt_text="x"), "needs prompt audio"),
        (SynthesisRequest(text="hi", mode="zero_shot", prompt_audio=prompt(2)), "needs 'prompt_text'"),
        (SynthesisRequest(text="hi", mode="zero_shot", prompt_text="x", prompt_audio=prompt(0.5)), "0.50 s long; send 1 to 30"),
        (SynthesisRequest(text="hi", mode="zero_shot", prompt_text="x", prompt_audio=prompt(31)), "31.0 s long"),
        (SynthesisRequest(text="hi", mode="instruct", speaker="a"), "needs 'instruct_text'"),
        (SynthesisRequest(text="hi", mode="vc", prompt_audio=prompt(2)), "needs 'source_audio'"),
        (SynthesisRequest(text="hi", speaker="a", speed=5), "speed must be between"),
    ],
)
def test_invalid_inputs_say_what_to_do(req, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.").replace("?", r"\?")):
        check_mode_inputs(req, ALL, SPK)


def test_mode_the_model_cannot_do_is_refused_with_the_supported_list():
    req = SynthesisRequest(text="hi", mode="instruct2", instruct_text="x", prompt_audio=prompt(2))
    with pytest.raises(InvalidInput, match="not supported by the loaded model; it supports: sft, zero_shot"):
        check_mode_inputs(req, ("sft", "zero_shot"), SPK)


def test_valid_requests_pass():
    check_mode_inputs(SynthesisRequest(text="hi", speaker="a"), ALL, SPK)
    check_mode_inputs(SynthesisRequest(text="hi", mode="zero_shot", prompt_text="t", prompt_audio=prompt(3)), ALL, SPK)
    check_mode_inputs(SynthesisRequest(mode="vc", prompt_audio=prompt(3), source_audio=prompt(2)), ALL, SPK)


def test_float_to_int16_clips_and_sanitises():
    out = float_to_int16(np.array([0.0, 0.5, 2.0, -3.0, np.nan, np.inf], dtype=np.float32))
    assert out.dtype == np.int16
    assert out.tolist() == [0, 16383, 32767, -32767, 0, 32767]


def test_fake_engine_satisfies_the_protocol_and_is_deterministic():
    eng = FakeEngine(FakeBehaviour(chunks=4, chunk_s=0.1))
    assert isinstance(eng, Engine)
    eng.load()
    eng.warmup()
    req = SynthesisRequest(text="hi", speaker="fake_female", request_id="r1")
    a = list(eng.synthesize(req, threading.Event()))
    b = list(eng.synthesize(req, threading.Event()))
    assert len(a) == 4 and all(isinstance(c, AudioChunk) for c in a)
    assert all(len(c.pcm) == 2400 and c.sample_rate == 24000 for c in a)
    assert all(np.array_equal(x.pcm, y.pcm) for x, y in zip(a, b))
    assert eng.b.finished == ["r1", "r1"]


def test_fake_engine_faults_and_cancel():
    b = FakeBehaviour(chunks=5, fail_at_chunk=2)
    eng = FakeEngine(b)
    gen = eng.synthesize(SynthesisRequest(text="hi", speaker="fake_male", request_id="x"), threading.Event())
    assert len([next(gen), next(gen)]) == 2
    with pytest.raises(EngineFailure):
        next(gen)
    b.fail_at_chunk = None
    b.chunk_delay_s = 10
    cancel = threading.Event()
    gen = eng.synthesize(SynthesisRequest(text="hi", speaker="fake_male", request_id="y"), cancel)
    next(gen)
    cancel.set()
    assert list(gen) == []
    assert "y" in b.cancelled


def test_fake_load_failure():
    with pytest.raises(EngineFailure):
        FakeEngine(FakeBehaviour(fail_on_load=True)).load()


def test_contract_modules_do_not_import_torch_or_web_frameworks():
    import app.engines.base  # noqa: F401
    import app.engines.fake  # noqa: F401
    import app.serving.pool  # noqa: F401

    for mod in ("app.engines.base", "app.engines.fake", "app.serving.pool", "app.serving.bridge", "app.serving.job"):
        src = Path(sys.modules[mod].__file__).read_text()
        for banned in ("import torch", "fastapi", "starlette", "prometheus"):
            assert banned not in src, (mod, banned)
