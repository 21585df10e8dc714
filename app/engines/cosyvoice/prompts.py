"""Where each CosyVoice family wants its system prompt, instruction and end-of-prompt marker.

Pure string logic (no torch), so it is unit-tested without any CosyVoice installed.

CosyVoice3's LLM refuses text without ``<|endofprompt|>`` (id 151646). Upstream's own
CosyVoice3 examples (``example.py`` at HEAD ace7c47) place it like this, and so do we:

* zero_shot: prompt text ``You are a helpful assistant.<|endofprompt|>`` + the transcript;
* cross_lingual: text ``You are a helpful assistant.<|endofprompt|>`` + the text to speak
  (sft, which upstream shows no v3 example for, has the same shape: no prompt text);
* instruct2: instruct text ``You are a helpful assistant. <instruction><|endofprompt|>``.

CosyVoice2 wants ``<instruction><|endofprompt|>`` for instruct2 and nothing elsewhere;
CosyVoice-300M-Instruct (v1) wants ``<instruction><endofprompt>``.
"""

from __future__ import annotations

from app.engines.cosyvoice.layout import ENDOFPROMPT

V1_ENDOFPROMPT = "<endofprompt>"
V3_SYSTEM = "You are a helpful assistant."
V3_SYSTEM_PROMPT = V3_SYSTEM + ENDOFPROMPT


def _with_suffix(text: str, suffix: str) -> str:
    return text if text.endswith(suffix) else text + suffix


def instruction(version: int, instruct_text: str) -> str:
    """The instruct/instruct2 prompt text for an instruction such as "Speak happily."."""
    text = (instruct_text or "").strip()
    if version == 1:
        return _with_suffix(text, V1_ENDOFPROMPT)
    if ENDOFPROMPT in text:  # already in the model's own format: the caller knows best
        return text
    if version >= 3 and not text.startswith(V3_SYSTEM):
        text = f"{V3_SYSTEM} {text}"
    return text + ENDOFPROMPT


def zero_shot_prompt(version: int, transcript: str) -> str:
    """The zero-shot prompt text: the transcript of the prompt audio (v3: after the system prompt)."""
    text = (transcript or "").strip()
    if version >= 3 and ENDOFPROMPT not in text:
        return V3_SYSTEM_PROMPT + text
    return text


def speech_text(version: int, mode: str, segment: str) -> str:
    """The text the LLM speaks for one segment; v3 sft / cross_lingual carry the system prompt here."""
    if version >= 3 and mode in ("sft", "cross_lingual") and ENDOFPROMPT not in segment:
        return V3_SYSTEM_PROMPT + segment
    return segment
