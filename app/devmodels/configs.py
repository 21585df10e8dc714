"""The HyperPyYAML configs of the random-weight model dirs: templates plus the values of each variant.

The config text lives in ``templates/`` (package data, shipped in the wheel), one file per
CosyVoice version named as the file it becomes (``layout.CONFIG_FILES``), plus partials
shared between them (``_name.yaml``). The classes are the ones CosyVoice itself instantiates
for each model family; the sizes are ours: deliberately small (tiny), or CosyVoice2-0.5B's
(``full_size``, v2 only). Like a released config, each also carries what only training reads:
the global seeds, HiFT's GAN wrapper, the data pipeline (``cosyvoice.dataset.processor``) and
the optimiser settings, so every test loads what a real dir holds. This module holds only
those values and a small renderer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from string import Template
from typing import Any

from app.engines.cosyvoice.layout import CONFIG_FILES

TEMPLATES = resources.files("app.devmodels") / "templates"

# Sizes the builders rely on (stop.py's controller and the tiny Qwen2 assume this exact LLM).
LLM_DIM = 64  # llm_input_size == llm_output_size
LLM_HEADS = 2
LLM_UNITS = 128  # feed-forward width of the v1 LLM / Qwen2 intermediate size
HIFT_BASE = 32
V1_TEXT_DIM = 32  # v1 text embedding width (the whisper vocabulary dominates the size)
V1_TEXT_VOCAB = 60515  # >= n_vocab of the multilingual whisper encoding incl. its specials
V2_FLOW_DIM = 512  # CosyVoice2's UpsampleConformerEncoder hardcodes 512 channels
SPEECH_VOCAB = {1: 4096, 2: 6561, 3: 6561}  # the LLM's speech_token_size, as in the released models

TINY: dict[str, Any] = {
    "dim": LLM_DIM,
    "heads": LLM_HEADS,
    "units": LLM_UNITS,
    "hift_base": HIFT_BASE,
    "res_kernels": "[3]",
    "res_dilations": "[[1, 3, 5]]",
}

# CosyVoice2 sizes that differ between the tiny model and the full-size one. The full-size
# values are CosyVoice2-0.5B's (upstream examples/libritts/cosyvoice2/conf/cosyvoice2.yaml):
# flow ~112.5 M parameters, HiFT ~20.8 M. Dropout stays 0 (inference only; no parameters).
V2_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "title": "tiny",
        "enc_heads": 4,
        "enc_units": 128,
        "enc_blocks": 1,
        "est_channels": LLM_DIM,
        "est_head_dim": 32,
        "est_blocks": 1,
        "est_mid_blocks": 1,
        "est_heads": 2,
    },
    "full": {
        "title": "full-size",
        "dim": 896,
        "enc_heads": 8,
        "enc_units": 2048,
        "enc_blocks": 6,
        "est_channels": 256,
        "est_head_dim": 64,
        "est_blocks": 4,
        "est_mid_blocks": 12,
        "est_heads": 8,
        "hift_base": 512,
        "res_kernels": "[3, 7, 11]",
        "res_dilations": "[[1, 3, 5], [1, 3, 5], [1, 3, 5]]",
    },
}

# The training-only part every released config carries (data pipeline, HiFT's GAN, optimiser):
# the mel frame of each family, how many samples the GAN runs cut (a whole number of frames),
# the utterance lengths the data filter keeps (in frames), and whether the pipeline has the
# whisper log-mel step (upstream's CosyVoice3 config; ``""`` leaves it out).
_TRAINING: dict[int, dict[str, Any]] = {
    1: {"mel_fft": 1024, "mel_hop": 256, "truncate_samples": 96 * 256, "filter_max_frames": 40960,
        "filter_min_frames": 0, "whisper_fbank": "", "whisper_fbank_step": ""},
    2: {"mel_fft": 1920, "mel_hop": 480, "truncate_samples": 51 * 480, "filter_max_frames": 6000,
        "filter_min_frames": 100, "whisper_fbank": "", "whisper_fbank_step": ""},
    3: {"mel_fft": 1920, "mel_hop": 480, "truncate_samples": 52 * 480, "filter_max_frames": 6000,
        "filter_min_frames": 100},
}

_PER_VERSION: dict[int, dict[str, Any]] = {
    1: {"text_dim": V1_TEXT_DIM, "text_vocab": V1_TEXT_VOCAB, **_TRAINING[1]},
    2: {"flow_dim": V2_FLOW_DIM, "hift_generator": "HiFTGenerator", "hift_f0_predictor": "ConvRNNF0Predictor",
        "hift_causal": "", **_TRAINING[2]},
    3: {"hift_generator": "CausalHiFTGenerator", "hift_f0_predictor": "CausalConvRNNF0Predictor",
        "hift_causal": "conv_pre_look_right: 4", **_TRAINING[3]},
}


def render_yaml(version: int, *, full_size: bool = False) -> str:
    """The config text for a random-weight model of CosyVoice ``version``.

    ``full_size`` (v2 only): CosyVoice2-0.5B's real dimensions instead of the tiny ones.
    """
    if version not in CONFIG_FILES:
        raise ValueError(f"no tiny yaml for CosyVoice version {version!r}")
    if full_size and version != 2:
        raise ValueError(f"full-size random-weight models exist for CosyVoice2 only, not version {version}")
    values = {**TINY, "speech_vocab": SPEECH_VOCAB[version], **_PER_VERSION[version]}
    if version == 2:
        values.update(V2_SIZES["full" if full_size else "tiny"])
    return render_template(CONFIG_FILES[version], values)


_BLOCK = re.compile(r"(?P<indent> *)\$(?:(?P<name>\w+)|\{(?P<braced>\w+)\}) *\n?")


def render_template(name: str, values: Mapping[str, Any], root: Traversable = TEMPLATES) -> str:
    """``root/<name>`` (``root``: ``templates/``) with ``values`` filled in. The rules, line by line:

    * a line starting with ``##`` is a template comment: dropped;
    * a line holding only ``$key`` is a block: the value of ``key`` (or, without one, the
      partial ``_key.yaml`` rendered with the same values), each of its lines indented like
      ``$key``; an empty value drops the line;
    * any other line is a :class:`string.Template` (``$key`` / ``${key}``; a missing value raises).
    """
    out: list[str] = []
    for line in (root / name).read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith("##"):
            continue
        block = _BLOCK.fullmatch(line)
        if block is None:
            out.append(Template(line).substitute(values))
            continue
        key = block["name"] or block["braced"]
        text = str(values[key]) if key in values else render_template(f"_{key}.yaml", values, root)
        out.extend(block["indent"] + part + "\n" if part else "\n" for part in text.splitlines())
    return "".join(out)
