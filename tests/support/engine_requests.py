"""Synthesis requests that batch together: one of every LLM mode, prompts and texts of many lengths."""

from __future__ import annotations

from app.engines.base import PromptAudio, SynthesisRequest
from tests.support.sounds import speechlike

TEXTS = [
    "Hello there.",
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Batching many requests together makes the language model far cheaper per token.",
    "Short one.",
    "A sentence of middling length, spoken once.",
    "Numbers like four and seven, then a pause, and a longer closing clause to end it.",
]


def mixed_requests(engine) -> list[SynthesisRequest]:
    """8 requests: every LLM mode, prompts of 1.5-6 s, texts of 2-16 words."""
    spk = engine.voices()[0]
    short, long_ = PromptAudio(speechlike(1.5, seed=1), 16000), PromptAudio(speechlike(6.0, seed=2), 16000)
    return [
        SynthesisRequest(text=TEXTS[0], mode="sft", speaker=spk),
        SynthesisRequest(text=TEXTS[1], mode="sft", speaker=spk),
        SynthesisRequest(text=TEXTS[2], mode="zero_shot", prompt_text="a short prompt", prompt_audio=short),
        SynthesisRequest(text=TEXTS[3], mode="zero_shot", prompt_text="a much longer prompt transcript here",
                         prompt_audio=long_),
        SynthesisRequest(text=TEXTS[4], mode="cross_lingual", prompt_audio=long_),
        SynthesisRequest(text=TEXTS[5], mode="instruct2", instruct_text="speak slowly", prompt_audio=short),
        SynthesisRequest(text=TEXTS[1], mode="instruct2", instruct_text="whisper, please", prompt_audio=long_),
        SynthesisRequest(text=TEXTS[2], mode="cross_lingual", prompt_audio=short),
    ]
