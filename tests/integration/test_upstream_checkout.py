"""The adapter on a user's upstream CosyVoice checkout (``engine.cosyvoice_path``).

CI cannot fetch upstream, so this runs only when asked: ``make test-upstream
UPSTREAM=/path/to/CosyVoice`` (marker ``upstream``, deselected by default). It runs
in a subprocess because the checkout must be first on ``sys.path`` before any
``cosyvoice`` import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

SCRIPT = r"""
import sys, threading
from app.engines.base import PromptAudio, SynthesisRequest
from app.engines.cosyvoice import CosyVoiceConfig, CosyVoiceEngine
from tests.integration.conftest import speechlike
model_dir, upstream, modes, batching = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4] == "1"
eng = CosyVoiceEngine(CosyVoiceConfig(model_dir=model_dir, cosyvoice_path=upstream, batching=batching, llm_greedy=batching))
eng.load()
assert eng.batching == batching
import cosyvoice
assert cosyvoice.__file__.startswith(upstream), cosyvoice.__file__
prompt = PromptAudio(speechlike(3.0), 16000)
kw = {"sft": dict(speaker="tiny_female"), "zero_shot": dict(prompt_text="hello there my friend", prompt_audio=prompt),
      "cross_lingual": dict(prompt_audio=prompt), "instruct2": dict(prompt_audio=prompt, instruct_text="Speak happily."),
      "vc": dict(prompt_audio=prompt, source_audio=PromptAudio(speechlike(2.0, seed=2), 16000))}
for mode in modes:
    for stream in (False, True):
        chunks = list(eng.synthesize(SynthesisRequest(text="Hello there, this is a test.", mode=mode, stream=stream, **kw[mode]), threading.Event()))
        seconds = sum(c.duration_s for c in chunks)
        assert chunks and seconds > 0.2, (mode, stream, seconds)
        print(mode, stream, len(chunks), round(seconds, 2))
if batching:  # upstream's own llm.inference alone == our batched decoding, token for token
    import torch
    from tests.integration.test_batching import llm_inputs, make_scheduler, reference, submit
    reqs = [SynthesisRequest(text=t, mode="zero_shot", **kw["zero_shot"]) for t in ("Hello there.", "A longer sentence to decode here.")]
    inputs = [llm_inputs(eng, r) for r in reqs]
    lm, sched = make_scheduler(eng)
    seqs = [submit(lm, sched, mi) for mi in inputs]
    for seq, mi in zip(seqs, inputs):
        seq.wait_for(1 << 30, timeout=120)
        assert seq.tokens == reference(eng, mi)[0]
    sched.stop()
"""


@pytest.mark.parametrize("version, modes, batching", [
    (1, "sft,zero_shot,cross_lingual,vc", "0"),
    (2, "sft,zero_shot,cross_lingual,instruct2,vc", "0"),
    (2, "sft,zero_shot,cross_lingual,instruct2,vc", "1"),
], ids=["v1", "v2", "v2-batched"])
def test_every_mode_on_an_upstream_checkout(tiny_models, version, modes, batching):
    upstream = os.environ.get("COSYSERVE_TEST_UPSTREAM", "")
    assert upstream and (Path(upstream) / "cosyvoice").is_dir(), "set COSYSERVE_TEST_UPSTREAM to a CosyVoice checkout"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_models(version)), str(Path(upstream).resolve()), modes, batching],
                         cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert len(out.stdout.splitlines()) == 2 * len(modes.split(","))
