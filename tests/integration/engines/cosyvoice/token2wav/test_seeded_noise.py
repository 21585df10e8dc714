"""A seeded request gives the same PCM bytes every time: its vocoder noise comes from its own generator.

Real CosyVoice2 classes on the tiny random-weight model, the engine as the server builds it (LLM
batching on); the check itself (10 runs alone, 10 beside four others, the global generator moved
between them) is tests/support/seeded.py. CosyVoice3: tests/integration/upstream (needs a checkout).
"""

from __future__ import annotations

import pytest
import torch

from app.engines.cosyvoice.engine import CosyVoiceEngine
from app.engines.cosyvoice.token2wav.noise import noise_generator, request_noise
from app.settings import Settings, runtime
from tests.support.seeded import REPEATS, check_repeats

pytestmark = pytest.mark.integration


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


@pytest.mark.parametrize("version", [2])  # v3: tests/integration/upstream (needs a checkout)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_seeded_request_gives_the_same_bytes(served, prompt_audio, version, stream):
    """10 runs alone and 10 beside four others give the first run's bytes; another seed, other bytes."""
    check_repeats(served(version), prompt_audio, stream=stream, repeats=REPEATS)


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
