"""CosyVoiceEngine on tiny random-weight models built from the real CosyVoice classes."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from app.engines.base import InvalidInput, PromptAudio, SynthesisRequest
from tests.support.sounds import speechlike

pytestmark = pytest.mark.integration

TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the quiet green hills."
RATES = {1: 22050, 2: 24000}


def run(engine, req, cancel=None, seed=0):
    torch.manual_seed(seed)
    chunks = list(engine.synthesize(req, cancel or threading.Event()))
    return chunks


def check_audio(chunks, rate, min_s=0.2, max_s=30.0):
    assert chunks, "no audio"
    for c in chunks:
        assert c.sample_rate == rate
        assert c.pcm.dtype == np.int16 and c.pcm.ndim == 1
    pcm = np.concatenate([c.pcm for c in chunks])
    seconds = len(pcm) / rate
    assert min_s <= seconds <= max_s, seconds
    assert np.abs(pcm.astype(np.int32)).max() > 0, "silence"
    return pcm


def mode_request(mode, prompt, stream, version):
    kw = {
        "sft": dict(speaker="tiny_female"),
        "zero_shot": dict(prompt_text="hello there my friend, how are you", prompt_audio=prompt),
        "cross_lingual": dict(prompt_audio=prompt),
        "instruct": dict(speaker="tiny_male", instruct_text="Speak calmly and slowly."),
        "instruct2": dict(prompt_audio=prompt, instruct_text="Speak happily."),
        "vc": dict(prompt_audio=prompt, source_audio=PromptAudio(speechlike(2.0, seed=3), 16000)),
    }[mode]
    return SynthesisRequest(text=TEXT, mode=mode, stream=stream, **kw)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["sft", "zero_shot", "cross_lingual", "instruct2", "vc"])
def test_v2_every_mode(engines, prompt_audio, mode, stream):
    eng = engines(2)
    chunks = run(eng, mode_request(mode, prompt_audio, stream, 2))
    pcm = check_audio(chunks, 24000)
    if mode == "vc":  # voice conversion keeps the source's length
        assert abs(len(pcm) / 24000 - 2.0) < 0.25


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["sft", "zero_shot", "cross_lingual", "vc"])
def test_v1_every_mode(engines, prompt_audio, mode, stream):
    check_audio(run(engines(1), mode_request(mode, prompt_audio, stream, 1)), 22050)


@pytest.mark.parametrize("stream", [False, True])
def test_v1_instruct_model(engines, prompt_audio, stream):
    eng = engines(1, instruct=True)
    assert "instruct" in eng.info().modes
    check_audio(run(eng, mode_request("instruct", prompt_audio, stream, 1)), 22050)


def test_modes_the_model_cannot_do_are_refused(engines, prompt_audio):
    v1 = engines(1)
    assert "instruct" not in v1.info().modes and "instruct2" not in v1.info().modes
    for mode in ("instruct", "instruct2"):
        with pytest.raises(InvalidInput, match="not supported by the loaded model"):
            run(v1, mode_request(mode, prompt_audio, False, 1))
    assert "instruct" not in engines(2).info().modes


@pytest.mark.parametrize(
    "req, message",
    [
        (SynthesisRequest(text=TEXT, speaker="nobody"), "unknown speaker 'nobody'; known speakers: tiny_female, tiny_male"),
        (SynthesisRequest(text="   ", speaker="tiny_female"), "text is empty"),
        (SynthesisRequest(text="...", speaker="tiny_female"), "nothing to speak"),
        (SynthesisRequest(text=TEXT, mode="zero_shot", prompt_text="hi", prompt_audio=PromptAudio(speechlike(0.5), 16000)), "send 1 to 30 seconds"),
        (SynthesisRequest(text=TEXT, mode="zero_shot", prompt_text="hi", prompt_audio=PromptAudio(speechlike(31), 16000)), "send 1 to 30 seconds"),
    ],
)
def test_bad_input_is_invalid_input(engines, req, message):
    with pytest.raises(InvalidInput, match=message):
        run(engines(2), req)


def test_long_model_streams_several_chunks(engines):
    for version in (1, 2):
        eng = engines(version, long=True)
        chunks = run(eng, SynthesisRequest(text=TEXT, speaker="tiny_female", stream=True))
        check_audio(chunks, RATES[version], max_s=60)
        assert len(chunks) >= 3, (version, len(chunks))


def test_long_text_is_synthesised_sentence_by_sentence(engines):
    text = "This is the first sentence of a longer text. " * 3 + "And here the text comes to its end."
    chunks = run(engines(2), SynthesisRequest(text=text, speaker="tiny_male", stream=False))
    assert len(chunks) == 4  # one chunk per sentence when not streaming


def test_speed_shortens_audio(engines):
    eng = engines(2)
    normal = check_audio(run(eng, SynthesisRequest(text=TEXT, speaker="tiny_female"), seed=7), 24000)
    fast = check_audio(run(eng, SynthesisRequest(text=TEXT, speaker="tiny_female", speed=2.0), seed=7), 24000, min_s=0.05)
    assert abs(len(fast) / len(normal) - 0.5) < 0.05


def test_prompt_sample_rate_is_handled_in_our_code(engines, prompt_audio):
    """A 44.1 kHz prompt gives the same audio as the same prompt at 16 kHz (resampled by us)."""
    import torchaudio.functional as AF

    eng = engines(2)
    hi = AF.resample(torch.from_numpy(prompt_audio.samples), 16000, 44100).numpy()
    a = run(eng, mode_request("zero_shot", prompt_audio, False, 2), seed=3)
    b = run(eng, mode_request("zero_shot", PromptAudio(hi, 44100), False, 2), seed=3)
    la, lb = sum(len(c.pcm) for c in a), sum(len(c.pcm) for c in b)
    assert abs(la - lb) / la < 0.2


def test_loaded_weights_equal_the_files_and_are_in_eval_mode(engines, tiny_models):
    for version in (1, 2):
        eng = engines(version)
        model = eng.loaded.model
        for name in ("llm", "flow", "hift"):
            module = getattr(model, name)
            assert not module.training, name
            assert all(not m.training for m in module.modules()), name
            saved = torch.load(tiny_models(version) / f"{name}.pt", map_location="cpu", weights_only=True)
            live = module.state_dict()
            assert set(saved) == set(live), name
            for key, value in saved.items():
                assert torch.equal(live[key].cpu().float(), value.float()), (name, key)


def test_inline_prompt_features_are_cached(engines, prompt_audio):
    eng = engines(2)
    before = eng.prompts.hits
    run(eng, mode_request("zero_shot", prompt_audio, False, 2))
    run(eng, mode_request("zero_shot", prompt_audio, False, 2))
    assert eng.prompts.hits >= before + 1


def test_exported_voice_gives_the_same_audio_as_the_inline_prompt(engines, prompt_audio):
    eng = engines(2)
    voice = eng.import_voice(eng.export_voice(eng.compute_voice("hello there my friend, how are you", prompt_audio)))
    inline = run(eng, mode_request("zero_shot", prompt_audio, False, 2), seed=11)
    stored = run(eng, SynthesisRequest(text=TEXT, mode="zero_shot", voice=voice), seed=11)
    assert np.array_equal(np.concatenate([c.pcm for c in inline]), np.concatenate([c.pcm for c in stored]))


def test_two_model_families_in_one_process(engines, prompt_audio):
    """matcha's mel cache is keyed only by fmax/device: v1 then v2 prompt paths must both work."""
    for version in (1, 2, 1, 2):
        check_audio(run(engines(version), mode_request("zero_shot", prompt_audio, False, version)), RATES[version])


def _model_state_sizes(model) -> int:
    return sum(len(v) for k, v in vars(model).items() if k.endswith("_dict") and isinstance(v, dict))


@pytest.mark.parametrize("how", ["flag", "close"])
def test_cancel_stops_the_llm_thread_and_frees_state(engines, how):
    eng = engines(2, long=True)
    cancel = threading.Event()
    text = " ".join([TEXT] * 3)
    gen = eng.synthesize(SynthesisRequest(text=text, speaker="tiny_female", stream=True), cancel)
    first = next(gen)
    assert len(first.pcm) > 0
    llm_threads_before = threading.active_count()
    if how == "flag":
        cancel.set()
        rest = list(gen)
        assert len(rest) <= 1  # stops within one chunk
    else:
        gen.close()  # the consumer went away without setting the flag
    # CosyVoice's LLM thread must not keep burning CPU after the cancel
    time.sleep(0.3)
    cpu0 = time.process_time()
    time.sleep(1.0)
    burned = time.process_time() - cpu0
    assert burned < 0.15, f"{burned:.2f} CPU-s burned after cancel"
    assert threading.active_count() <= llm_threads_before
    assert _model_state_sizes(eng.loaded.model) == 0
    assert eng.cancels.active() == 0
    # and the engine still works
    check_audio(run(eng, SynthesisRequest(text="Still alive after a cancel.", speaker="tiny_male")), 24000, max_s=60)


def test_warmup_and_health(engines):
    eng = engines(2)
    eng.warmup()
    eng.health_check()
    info = eng.info()
    assert info.family == "cosyvoice2" and info.tiny and info.sample_rate == 24000
    assert info.voice_family.startswith("cosyvoice2-")
    assert list(eng.voices()) == ["tiny_female", "tiny_male"]
