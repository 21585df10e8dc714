"""The persistent voice library: register a voice once, use it on every request."""

from app.voices.library import (
    VoiceComputeFailed,
    VoiceError,
    VoiceExists,
    VoiceLibrary,
    VoiceLimitReached,
    VoiceNotFound,
    VoiceStorageFull,
)

__all__ = ["VoiceComputeFailed", "VoiceError", "VoiceExists", "VoiceLibrary", "VoiceLimitReached", "VoiceNotFound",
           "VoiceStorageFull"]
