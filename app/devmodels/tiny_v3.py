"""The CosyVoice3 text tokenizer of the tiny random-weight model builder (see ``tiny.py``).

CosyVoice3's LLM hardcodes ``<|endofprompt|>`` as text id 151646 (Qwen2's vocabulary plus
three specials), so the tiny byte-level BPE (~4k merges, trained here) is padded with
unreachable filler entries up to id 151642, and ``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>``, ``<|endofprompt|>`` follow at 151643-151646, as in the real model
(``layout.QWEN_SPECIALS``). CosyVoice's own ``CosyVoice3Tokenizer`` adds its other specials
after those when it loads the dir. The v3 config is ``templates/cosyvoice3.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.engines.cosyvoice.layout import (
    ENDOFPROMPT,
    ENDOFPROMPT_ID,
    QWEN_SPECIALS,
    QWEN_SPECIALS_START,
)


def write_tokenizer(path: Path, trained: Any) -> int:
    """Save a Qwen2-numbered tokenizer built from ``trained`` (a tokenizers BPE); returns its size.

    ``trained`` has no special tokens. Its vocab and merges are kept, filler entries that
    no merge can produce pad the ids up to 151642, then the four specials follow.
    """
    import json

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    state = json.loads(trained.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    if len(vocab) > QWEN_SPECIALS_START:
        raise ValueError("trained vocabulary is larger than Qwen2's")
    used = set(vocab.values())
    free = (i for i in range(QWEN_SPECIALS_START) if i not in used)
    for n, i in enumerate(free):
        vocab[f"<|cosyserve_filler_{n}|>"] = i
    state["added_tokens"] = [
        {"id": QWEN_SPECIALS_START + k, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for k, tok in enumerate(QWEN_SPECIALS)
    ]
    tok = Tokenizer.from_str(json.dumps(state))
    if tok.token_to_id(ENDOFPROMPT) != ENDOFPROMPT_ID:
        raise RuntimeError(f"tiny CosyVoice3 tokenizer: {ENDOFPROMPT} did not land on id {ENDOFPROMPT_ID}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(str(path))
    return tok.get_vocab_size()


def cosyvoice3_vocab_size(path: Path) -> int:
    """How many text ids CosyVoice's own CosyVoice3 tokenizer uses on ``path`` (it adds specials)."""
    from cosyvoice.tokenizer.tokenizer import get_qwen_tokenizer

    return len(get_qwen_tokenizer(str(path), True, version="cosyvoice3").tokenizer)
