"""The full-size random-weight CosyVoice2 builder (app/devmodels/fullsize.py, tiny.build_tiny_model(full_size=True)).

The fast tests instantiate the real CosyVoice classes from the full-size config (Qwen2 on
the meta device, so no GBs are allocated) and check the calibrated stop in CosyVoice's own
sampler. The build-and-load test writes ~4.5 GB and takes minutes: it is marked
``fullsize`` and deselected by default (``pytest -m fullsize tests/integration/devmodels/test_fullsize.py``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

import torch

from app.devmodels import configs, fullsize, tiny
from app.engines.cosyvoice import layout
from app.engines.cosyvoice.model_config import read_model_config
from app.engines.cosyvoice.shims import prepare_imports

TEXTS = ("Hello there, how are you?", "The quick brown fox jumps over the lazy dog near the quiet river bank today.")


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def full_configs():
    """flow and hift of the full-size yaml (the LLM is checked separately: it needs a Qwen dir)."""
    prepare_imports()
    text = configs.render_yaml(2, full_size=True)
    # keep the llm out: Qwen2Encoder loads a pretrained dir at construction
    head, rest = text.split("\nllm: ", 1)
    _, tail = rest.split("\nflow: ", 1)
    _import_named_modules(text)
    with tiny.preserved_rng(), torch.device("meta"):  # shapes only: nothing allocated
        return read_model_config(head + "\nflow: " + tail, model_dir=Path("unused"), version=2, name="full"), text


def _import_named_modules(yaml_text: str) -> None:
    """Import every module the yaml names (and CosyVoice's model classes) before the meta device is on.

    A module imported for the first time under ``torch.device("meta")`` keeps meta tensors in its
    default arguments (``CosyVoiceModel.tts(..., flow_prompt_speech_token=torch.zeros(1, 0))``) for
    the rest of the process, and every later test's CosyVoice call fails ("Cannot copy out of meta
    tensor").
    """
    import importlib
    import re

    names = {m.rsplit(".", 1)[0] for m in re.findall(r"!(?:new|name|apply):([\w.]+)", yaml_text)}
    for module in sorted(names | {"cosyvoice.cli.model", "cosyvoice.cli.frontend"}):
        importlib.import_module(module)


def test_full_size_flow_and_hift_have_cosyvoice2_05b_sizes(full_configs):
    configs, text = full_configs
    assert "llm_input_size: 896" in text and "base_channels: 512" in text
    flow, hift = configs["flow"], configs["hift"]
    assert type(flow).__name__ == "CausalMaskedDiffWithXvec"
    assert type(hift).__name__ == "HiFTGenerator"
    assert abs(_n_params(flow) / 1e6 - 112.5) < 1.0, _n_params(flow)
    assert abs(_n_params(hift) / 1e6 - 20.8) < 0.5, _n_params(hift)
    assert len(flow.encoder.encoders) == 6
    assert len(flow.decoder.estimator.mid_blocks) == 12


def test_tiny_yaml_unchanged_by_the_size_parameters():
    tiny_text = configs.render_yaml(2)
    assert "llm_input_size: 64" in tiny_text and "num_blocks: 1" in tiny_text
    assert "resblock_kernel_sizes: [3]\n" in tiny_text
    with pytest.raises(ValueError):
        configs.render_yaml(1, full_size=True)


def test_qwen_config_is_qwen25_05b_shape():
    from transformers import Qwen2ForCausalLM

    cfg = fullsize.qwen_config(4096, 0)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size) == (151936, 896, 4864)
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (24, 14, 2)
    assert cfg.tie_word_embeddings and cfg.rms_norm_eps == 1e-6
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert abs(_n_params(model) / 1e6 - 494.0) < 1.0, _n_params(model)
    with pytest.raises(ValueError):
        fullsize.qwen_config(200_000, 0)


def test_eos_bias_gives_the_wanted_nucleus_share():
    b = fullsize.eos_bias(0.85)
    share = torch.tensor(b).exp() / (torch.tensor(b).exp() + 24)
    assert abs(float(share) - 0.85) < 1e-6
    assert fullsize.expected_tokens(20) == pytest.approx(40 + 0.15 / 0.85)
    with pytest.raises(ValueError):
        fullsize.eos_bias(1.0)


def test_calibrated_head_stops_inside_cosyvoice_sampler():
    """The real Qwen2LM head + ras_sampling: EOS has ~0.85 of the draws, never all 101 in a row."""
    prepare_imports()
    from cosyvoice.llm.llm import Qwen2LM
    from cosyvoice.utils.common import ras_sampling

    llm = Qwen2LM(896, 896, 6561, llm=torch.nn.Identity(), sampling=ras_sampling)
    fullsize.calibrate_decoder(llm, torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(120, 896, generator=gen)  # after the final RMSNorm: rms ~1 per dim
    torch.manual_seed(2)
    eos, decoded = 0, []
    with torch.no_grad():
        for h in hidden:
            logp = llm.llm_decoder(h).log_softmax(dim=-1)
            top = int(llm.sampling(logp, decoded, 25))
            assert top <= 6561  # the fill / second stop id never win
            eos += top == 6561
            if top < 6561:
                decoded.append(top)
            # before the minimum length the PyPI copy resamples while EOS is drawn: must succeed
            assert llm.sampling_ids(logp, decoded, 25, ignore_eos=True) != 6561
    assert 0.75 < eos / len(hidden) < 0.95, eos


@pytest.mark.slow
@pytest.mark.fullsize
def test_build_and_load_full_size(tmp_path_factory):
    """Build the full-size dir (or reuse COSYSERVE_FULLSIZE_DIR), load it strictly, count tokens."""
    from app.engines.cosyvoice.load import load_model_dir

    given = os.environ.get("COSYSERVE_FULLSIZE_DIR")
    if given:
        out = Path(given)
    else:
        out = tmp_path_factory.mktemp("full2") / "m"
        tiny.build_tiny_model(out, 2, full_size=True)
    meta = layout.read_tiny_marker(out)
    assert meta["random_weights"] is True and meta["full_size"] is True
    loaded = load_model_dir(out)
    assert loaded.tiny
    llm = loaded.model.llm
    assert _n_params(llm.llm) > 490e6
    counts = []
    for text in TEXTS:
        ids = loaded.frontend._extract_text_token(text)[0]
        n_text = int(ids.shape[1])
        t0 = time.monotonic()
        with torch.inference_mode():
            toks = list(
                llm.inference(
                    text=ids, text_len=torch.tensor([n_text], dtype=torch.int32),
                    prompt_text=torch.zeros(1, 0, dtype=torch.int32),
                    prompt_text_len=torch.tensor([0], dtype=torch.int32),
                    prompt_speech_token=torch.zeros(1, 0, dtype=torch.int32),
                    prompt_speech_token_len=torch.tensor([0], dtype=torch.int32),
                    embedding=torch.zeros(1, 192),
                )
            )
        counts.append((n_text, len(toks), time.monotonic() - t0))
        assert 2 * n_text <= len(toks) <= 2 * n_text + 3, counts
    print("text tokens, speech tokens, seconds:", counts)
