"""The ``CosyVoice-BlankEN`` dir of a random-weight v2/v3 model: a text tokenizer trained here and a Qwen2.

* The tokenizer is a byte-level BPE (~4k entries) trained on the GPT-2 pieces shipped with
  openai-whisper, stored as the released dir stores Qwen2's: ``vocab.json``, ``merges.txt`` and
  a ``tokenizer_config.json`` naming ``Qwen2Tokenizer`` with ``<|endoftext|>``,
  ``<|im_start|>``, ``<|im_end|>`` as its added tokens (no ``tokenizer.json``), so transformers
  builds it the way it builds the real one. For CosyVoice2 the trained vocabulary holds the
  special tokens CosyVoice2's ``QwenTokenizer`` adds, as single entries.
* CosyVoice3's LLM hardcodes ``<|endofprompt|>`` as text id 151646 (Qwen2's vocabulary plus
  three specials), so for v3 the trained BPE is padded with unreachable filler entries up to
  id 151642, and ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` follow at 151643-151645,
  as in the real model (``layout.QWEN_SPECIALS``). CosyVoice's own ``CosyVoice3Tokenizer``
  adds ``<|endofprompt|>`` (151646) and its other specials after those when it loads the dir.
* The Qwen2 is tiny (``configs.LLM_DIM``, 2 layers), or Qwen2.5-0.5B's shape for the
  full-size v2 (``fullsize.qwen_config``, stored in bf16 like the real one).
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path
from typing import Any

from app.devmodels import configs, fullsize
from app.engines.cosyvoice.layout import (
    ENDOFPROMPT,
    ENDOFPROMPT_ID,
    QWEN_SPECIALS,
    QWEN_SPECIALS_START,
    QWEN_TOKENIZER_FILES,
)

# Special tokens CosyVoice2's QwenTokenizer adds; we put them in the trained vocab.
_QWEN_SPECIALS = (
    *QWEN_SPECIALS,
    "[breath]",
    "<strong>",
    "</strong>",
    "[noise]",
    "[laughter]",
    "[cough]",
    "[clucking]",
    "[accent]",
    "[quick_breath]",
    "<laughter>",
    "</laughter>",
    "[hissing]",
    "[sigh]",
    "[vocalized-noise]",
    "[lipsmack]",
    "[mn]",
)
_EOS = QWEN_SPECIALS[0]  # "<|endoftext|>"
_BPE_VOCAB = 4096
_BPE_CORPUS_WORDS = 8000


def write_blanken(path: Path, seed: int, *, version: int, full_size: bool = False) -> None:
    """CosyVoice-BlankEN: a byte-level BPE tokenizer trained here and a 2-layer Qwen2.

    ``full_size``: a Qwen2 of Qwen2.5-0.5B's shape instead (the tokenizer stays the small
    one; its ids are a subset of the real vocabulary), written in bf16.
    ``version=3``: the tokenizer is numbered like Qwen2's (see ``_write_v3_tokenizer``),
    so the embedding covers ~152k ids.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path.mkdir(parents=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB,
        special_tokens=[] if version == 3 else list(_QWEN_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer)
    if version == 3:
        _write_v3_tokenizer(path, tok)
        vocab = -(-_cosyvoice3_vocab_size(path) // 64) * 64
        eos = QWEN_SPECIALS_START + QWEN_SPECIALS.index(_EOS)
    else:
        state = json.loads(tok.to_str())
        vocab_ids = state["model"]["vocab"]
        _save_qwen_tokenizer(path, vocab_ids, state["model"]["merges"],
                             {vocab_ids[name]: name for name in QWEN_SPECIALS[:3]})
        vocab = -(-tok.get_vocab_size() // 64) * 64
        eos = tok.token_to_id(_EOS)
    if full_size:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(fullsize.qwen_config(vocab, eos))
        model.to(torch.bfloat16).save_pretrained(str(path))
        return
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=configs.LLM_DIM,
        intermediate_size=configs.LLM_UNITS,
        num_hidden_layers=2,
        num_attention_heads=configs.LLM_HEADS,
        num_key_value_heads=configs.LLM_HEADS,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=eos,
        dtype="float32",
    )
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(str(path))


def _corpus_lines() -> list[str]:
    """Deterministic training text: the first GPT-2 BPE pieces shipped with openai-whisper."""
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.origin:
        raise RuntimeError("openai-whisper is not installed; it is needed to train the tiny tokenizer")
    words: list[str] = []
    with open(Path(spec.origin).parent / "assets" / "gpt2.tiktoken", encoding="utf-8") as f:
        for line in f:
            b64, rank = line.split()
            if int(rank) < 256:
                continue
            try:
                words.append(base64.b64decode(b64).decode("utf-8"))
            except UnicodeDecodeError:
                continue
            if len(words) >= _BPE_CORPUS_WORDS:
                break
    return ["".join(words[i : i + 64]) for i in range(0, len(words), 64)]


def _write_v3_tokenizer(path: Path, trained: Any) -> None:
    """Save a Qwen2-numbered tokenizer built from ``trained`` (a tokenizers BPE).

    ``trained`` has no special tokens. Its vocab and merges are kept, filler entries that
    no merge can produce pad the ids up to 151642, then Qwen2's three added tokens follow;
    CosyVoice3's tokenizer adds ``<|endofprompt|>`` next, at 151646 (checked here).
    """
    from cosyvoice.tokenizer.tokenizer import get_qwen_tokenizer

    state = json.loads(trained.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    if len(vocab) > QWEN_SPECIALS_START:
        raise ValueError("trained vocabulary is larger than Qwen2's")
    used = set(vocab.values())
    free = (i for i in range(QWEN_SPECIALS_START) if i not in used)
    for n, i in enumerate(free):
        vocab[f"<|cosyserve_filler_{n}|>"] = i
    added = {QWEN_SPECIALS_START + k: tok for k, tok in enumerate(QWEN_SPECIALS) if tok != ENDOFPROMPT}
    _save_qwen_tokenizer(path, vocab, state["model"]["merges"], added)
    got = get_qwen_tokenizer(str(path), True, version="cosyvoice3").tokenizer.convert_tokens_to_ids(ENDOFPROMPT)
    if got != ENDOFPROMPT_ID:
        raise RuntimeError(f"tiny CosyVoice3 tokenizer: {ENDOFPROMPT} landed on id {got}, not {ENDOFPROMPT_ID}")


def _save_qwen_tokenizer(path: Path, vocab: dict[str, int], merges: list[Any], added: dict[int, str]) -> None:
    """Write the files a released CosyVoice-BlankEN holds for its tokenizer (``layout.QWEN_TOKENIZER_FILES``).

    ``vocab`` and ``merges`` are a byte-level BPE's; ``added`` the added (special) tokens by id.
    """
    ordered = dict(sorted(vocab.items(), key=lambda item: item[1]))
    vocab_file, merges_file, config_file = QWEN_TOKENIZER_FILES
    (path / vocab_file).write_text(json.dumps(ordered, ensure_ascii=False), encoding="utf-8")
    lines = [" ".join(m) if isinstance(m, (list, tuple)) else str(m) for m in merges]
    (path / merges_file).write_text("#version: 0.2\n" + "".join(f"{line}\n" for line in lines), encoding="utf-8")
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True}
            for i, tok in sorted(added.items())
        },
        "additional_special_tokens": [tok for tok in added.values() if tok != _EOS],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": _EOS,
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": _EOS,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (path / config_file).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                                encoding="utf-8")


def _cosyvoice3_vocab_size(path: Path) -> int:
    """How many text ids CosyVoice's own CosyVoice3 tokenizer uses on ``path`` (it adds specials)."""
    from cosyvoice.tokenizer.tokenizer import get_qwen_tokenizer

    return len(get_qwen_tokenizer(str(path), True, version="cosyvoice3").tokenizer)
