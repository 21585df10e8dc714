"""A seeded request gives the same PCM bytes every time: its vocoder noise comes from its own generator.

Real CosyVoice2/3 classes on the tiny random-weight models, the engine as the server builds it (LLM
batching on). Between runs the global generator is moved and other requests run beside the seeded one,
so any draw still taken from the global generator (or from another request's) would change the bytes.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from app.engines.base import SynthesisRequest
from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.token2wav.noise import noise_generator, request_noise
from app.settings import Settings, runtime

pytestmark = pytest.mark.integration

TEXT = "A seeded request gives the same bytes, alone or beside others."
OTHERS = ["Another request runs beside it.", "And a third one, a little longer than the second.",
          "A fourth, streamed.", "The fifth of them."]


@pytest.fixture(scope="module")
def served(tiny_models):
    """``get(version)``: an engine built from the defaults a user gets (LLM batching on, the CPU's flow
    runtime), as ``cosyserve serve`` builds it; one per version per module."""
    loaded: dict = {}

    def get(version: int) -> CosyVoiceEngine:
        if version not in loaded:
            model_dir = str(tiny_models(version))
            eng = CosyVoiceEngine(runtime.engine_config(Settings(engine={"model_dir": model_dir, "torch_threads": 1}),
                                                        model_dir))
            eng.load()
            assert eng.runner is not None  # the batched path, where seeds apply
            loaded[version] = eng
        return loaded[version]

    yield get
    for eng in loaded.values():
        eng.close()


def request(eng, prompt_audio, text: str, **kw) -> SynthesisRequest:
    speakers = list(eng.voices())
    if speakers:
        return SynthesisRequest(text=text, speaker=speakers[0], **kw)
    return SynthesisRequest(text=text, mode="cross_lingual", prompt_audio=prompt_audio, **kw)


def pcm(eng, req: SynthesisRequest, global_seed: int) -> bytes:
    torch.manual_seed(global_seed)  # another request's draws, or a restart, moved the global generator
    return np.concatenate([c.pcm for c in eng.synthesize(req, threading.Event())]).tobytes()


def beside_others(eng, prompt_audio, req: SynthesisRequest) -> bytes:
    """``req``'s bytes while four unseeded requests (two streamed) run in their own threads."""
    go = threading.Barrier(len(OTHERS) + 1)
    errors: list[BaseException] = []

    def other(i: int) -> None:
        try:
            go.wait()
            pcm(eng, request(eng, prompt_audio, OTHERS[i], stream=i % 2 == 1), global_seed=100 + i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=other, args=(i,)) for i in range(len(OTHERS))]
    for t in threads:
        t.start()
    go.wait()
    out = pcm(eng, req, global_seed=7)
    for t in threads:
        t.join()
    assert not errors, errors
    return out


@pytest.mark.parametrize("version", [2])  # v3: tests/integration/upstream (needs a checkout)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_seeded_request_gives_the_same_bytes(served, prompt_audio, version, stream):
    eng = served(version)
    seeded = request(eng, prompt_audio, TEXT, seed=1234, stream=stream)
    first = pcm(eng, seeded, global_seed=1)
    assert len(first) > 2000
    assert pcm(eng, seeded, global_seed=2) == first
    assert beside_others(eng, prompt_audio, seeded) == first
    assert pcm(eng, request(eng, prompt_audio, TEXT, seed=1235, stream=stream), global_seed=1) != first


def test_without_a_seed_the_vocoder_draws_from_the_global_generator(served):
    """What the generator fixes: the tiny v2's HiFT on one mel, with and without the request's noise."""
    hift = served(2).loaded.model.hift
    mel = torch.randn(1, 80, 40, generator=torch.Generator().manual_seed(0))

    def vocode(global_seed: int, seed: int | None) -> torch.Tensor:
        torch.manual_seed(global_seed)
        with torch.inference_mode(), request_noise(None if seed is None else noise_generator(seed)) as mode:
            speech, _ = hift.inference(speech_feat=mel)
        assert mode is None or mode.draws >= 2  # the sine source's noise and the unvoiced noise came from it
        return speech

    assert not torch.equal(vocode(1, None), vocode(2, None))  # upstream: the global generator decides
    assert torch.equal(vocode(1, 5), vocode(2, 5))
    assert not torch.equal(vocode(1, 5), vocode(1, 6))
