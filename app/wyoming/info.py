"""The answer to ``describe``: one TTS program, its voices (the model's presets and the voice library)."""

from __future__ import annotations

from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

from app.serving.speech import SpeechService

# What each model family speaks, as its model cards list it (ISO 639 codes; yue: Cantonese). A voice
# speaks every language its model does: CosyVoice clones the timbre, the text picks the language.
LANGUAGES: dict[str, tuple[str, ...]] = {
    "cosyvoice1": ("zh", "en", "ja", "ko", "yue"),
    "cosyvoice2": ("zh", "en", "ja", "ko", "yue"),
    "cosyvoice3": ("zh", "en", "ja", "ko", "de", "es", "fr", "it", "ru", "yue"),
}
DEFAULT_LANGUAGES = ("zh", "en")  # another engine (the tests' fake one)
ATTRIBUTION = Attribution(name="FunAudioLLM CosyVoice", url="https://github.com/FunAudioLLM/CosyVoice")
PROGRAM = "cosyserve"


def languages(family: str) -> list[str]:
    return list(LANGUAGES.get(family, DEFAULT_LANGUAGES))


def describe(speech: SpeechService, version: str) -> Info:
    """The presets first (the default voice is the first of them), then the library's registered voices."""
    langs = languages(speech.info.family)
    voices = [TtsVoice(name=name, attribution=ATTRIBUTION, installed=True, version=None, languages=langs,
                       description=f"{name} ({kind})")
              for kind, names in (("preset", speech.presets), ("registered voice", speech.voice_names()))
              for name in names]
    program = TtsProgram(name=PROGRAM, attribution=ATTRIBUTION, installed=True, version=version,
                         description=f"cosyserve: {speech.info.name} ({speech.info.family})", voices=voices,
                         supports_synthesize_streaming=True)
    return Info(tts=[program])
