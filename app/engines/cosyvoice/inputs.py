"""A request as CosyVoice model inputs: normalized text cut into segments, prompt features, markers.

``ModelInputs`` turns a ``SynthesisRequest`` into the dicts CosyVoice's ``tts()`` (or our
batched path) takes, one per text segment: the text normalized and planned into sentences
within the character and text-token budgets, the model family's prompt markers
(``prompts.py``), and the prompt's features (``voices.PromptFrontend``) shared by every
segment of a request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.engines.base import InvalidInput, SynthesisRequest
from app.engines.cosyvoice import prompts
from app.engines.cosyvoice.voices import PromptFrontend
from app.text.normalize import TextNormalizer
from app.text.segments import plan_text

_LLM_PROMPT_KEYS = ("llm_prompt_speech_token", "llm_prompt_speech_token_len")
_TEXT_PROMPT_KEYS = ("prompt_text", "prompt_text_len")
PROMPT_MODES = ("zero_shot", "cross_lingual", "instruct2")  # modes whose inputs start from prompt features


class ModelInputs:
    def __init__(self, frontend: Any, version: int, prompt_frontend: PromptFrontend, normalizer: TextNormalizer,
                 max_segment_chars: int, max_segment_tokens: int) -> None:
        self.frontend = frontend
        self.version = version
        self.prompt_frontend = prompt_frontend
        self.normalizer = normalizer
        self.max_segment_chars = max_segment_chars
        self.max_segment_tokens = max_segment_tokens

    # -- text -------------------------------------------------------------------------------------
    def normalized(self, req: SynthesisRequest, text: str) -> str:
        """``text`` normalized unless the request (``normalize: false``) or the config turned it off."""
        return text if req.normalize is False else self.normalizer.normalize(text)

    def text_tokens(self, text: str) -> int:
        return int(self.frontend._extract_text_token(text)[0].shape[1])

    def tokenize(self, text: str) -> list[int]:
        return [int(t) for t in self.frontend._extract_text_token(text)[0].flatten().tolist()]

    def segments(self, req: SynthesisRequest) -> list[str]:
        """The text pieces one LLM call each speaks, in order: normalized, then planned as every door plans
        text (``app/text/segments.py``: sentences within the character and text-token budgets; without the
        v3 system prompt the adapter adds to some modes)."""
        return plan_text(self.normalized(req, req.text), max_chars=self.max_segment_chars, count=self.text_tokens,
                         max_tokens=self.max_segment_tokens)

    # -- model inputs ------------------------------------------------------------------------------
    def prompt_inputs(self, req: SynthesisRequest) -> dict:
        """Model inputs shared by every segment of a prompt-based request (everything but the text)."""
        voice = self.prompt_frontend.for_request(req)
        base = dict(voice.features)
        if req.mode == "cross_lingual":
            drop = _TEXT_PROMPT_KEYS + _LLM_PROMPT_KEYS
        else:
            if req.mode == "instruct2":
                prompt_text = prompts.instruction(self.version, req.instruct_text or "")
                drop = _LLM_PROMPT_KEYS
            else:  # zero_shot: the request's transcript, else the registered voice's
                transcript = self.normalized(req, (req.prompt_text or "").strip() or voice.prompt_text)
                if not transcript.strip():
                    raise InvalidInput("mode 'zero_shot' needs 'prompt_text': the transcript of the prompt audio")
                prompt_text = prompts.zero_shot_prompt(self.version, transcript)
                drop = ()
            base["prompt_text"], base["prompt_text_len"] = self.frontend._extract_text_token(prompt_text)
        for k in drop:
            base.pop(k, None)
        return base

    def for_request(self, req: SynthesisRequest, sample_rate: int) -> Iterator[dict]:
        """One model input per segment of ``req``'s text (voice conversion: one for the source audio)."""
        fe = self.frontend
        if req.mode == "vc":
            audio = self.prompt_frontend.audio
            with audio(req.source_audio) as src, audio(req.prompt_audio) as prompt:
                model_input = fe.frontend_vc(src, prompt, sample_rate)
            yield model_input
            return
        segments = self.segments(req)
        if not segments:
            raise InvalidInput("text has nothing to speak (only punctuation or whitespace)")
        base = self.prompt_inputs(req) if req.mode in PROMPT_MODES else {}
        for seg in segments:
            seg = prompts.speech_text(self.version, req.mode, seg)
            if req.mode == "sft":
                yield fe.frontend_sft(seg, req.speaker)
            elif req.mode == "instruct":
                # composed here: the PyPI copy appends <endofprompt> itself, upstream HEAD does not
                model_input = fe.frontend_sft(seg, req.speaker)
                model_input.pop("llm_embedding", None)  # instruct mode drops the speaker from the LLM
                instruct = prompts.instruction(1, req.instruct_text or "")
                model_input["prompt_text"], model_input["prompt_text_len"] = fe._extract_text_token(instruct)
                yield model_input
            else:
                text, text_len = fe._extract_text_token(seg)
                yield dict(base, text=text, text_len=text_len)

    def with_text(self, req: SynthesisRequest, prompt: dict, text: str) -> dict:
        """``prompt`` (``bistream_prompt``'s) with one whole segment's text: the input ``for_request`` makes
        for that segment, so a streamed segment whose text has all come costs what it costs over HTTP."""
        seg = prompts.speech_text(self.version, req.mode, self.normalized(req, text))
        tokens, length = self.frontend._extract_text_token(seg)
        return dict(prompt, text=tokens, text_len=length)

    def bistream_prompt(self, req: SynthesisRequest) -> dict:
        """The prompt part of a bistream request's input (no text: the text arrives while it is spoken)."""
        model_input = self.frontend.frontend_sft("", req.speaker) if req.mode == "sft" else self.prompt_inputs(req)
        for key in ("text", "text_len"):
            model_input.pop(key, None)
        return model_input
