"""Where the system prompt, instruction and end-of-prompt marker go, per CosyVoice family (no torch)."""

from __future__ import annotations

from app.engines.cosyvoice.prompts import instruction, speech_text, zero_shot_prompt

SYSTEM = "You are a helpful assistant.<|endofprompt|>"


def test_v3_places_the_marker_as_upstreams_examples_do():
    # example.py (upstream ace7c47), cosyvoice3_example
    assert zero_shot_prompt(3, "希望你以后能够做的比我还好呦。") == SYSTEM + "希望你以后能够做的比我还好呦。"
    assert speech_text(3, "cross_lingual", "[breath]因为他们那一辈人") == SYSTEM + "[breath]因为他们那一辈人"
    assert instruction(3, "请用广东话表达。") == "You are a helpful assistant. 请用广东话表达。<|endofprompt|>"
    assert speech_text(3, "sft", "Hello.") == SYSTEM + "Hello."
    # the text itself carries no marker in the modes whose prompt does
    for mode in ("zero_shot", "instruct2"):
        assert speech_text(3, mode, "Hello.") == "Hello."


def test_v3_text_already_in_the_models_format_is_kept():
    assert zero_shot_prompt(3, SYSTEM + "hello") == SYSTEM + "hello"
    assert speech_text(3, "cross_lingual", SYSTEM + "hi") == SYSTEM + "hi"
    assert instruction(3, "You are a helpful assistant. Speak slowly.<|endofprompt|>") == \
        "You are a helpful assistant. Speak slowly.<|endofprompt|>"
    assert instruction(3, "You are a helpful assistant. Speak slowly.") == \
        "You are a helpful assistant. Speak slowly.<|endofprompt|>"
    assert instruction(3, "  Speak slowly.  ") == "You are a helpful assistant. Speak slowly.<|endofprompt|>"


def test_v2_and_v1_formats():
    assert instruction(2, "用四川话说这句话") == "用四川话说这句话<|endofprompt|>"
    assert instruction(2, "用四川话说这句话<|endofprompt|>") == "用四川话说这句话<|endofprompt|>"
    assert zero_shot_prompt(2, " hello there ") == "hello there"
    assert speech_text(2, "cross_lingual", "Hello.") == "Hello."
    assert speech_text(1, "sft", "Hello.") == "Hello."
    assert instruction(1, "A calm narrator.") == "A calm narrator.<endofprompt>"
    assert instruction(1, "A calm narrator.<endofprompt>") == "A calm narrator.<endofprompt>"
