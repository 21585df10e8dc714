"""The output format table: what each response format is and which rates it takes.

Pure data plus two lookups; no codec is touched here.
"""

from __future__ import annotations

from dataclasses import dataclass

# Sample rates defined by the MPEG-1/2/2.5 layer III standard.
MPEG_AUDIO_RATES: tuple[int, ...] = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
# The sampling frequency indices an AAC ADTS header can express.
AAC_RATES: tuple[int, ...] = (
    7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000,
)
# Opus only runs at these; every Ogg Opus decoder hands back 48 kHz (RFC 7845 5.1).
OPUS_RATES: tuple[int, ...] = (8000, 12000, 16000, 24000, 48000)
OPUS_OUTPUT_RATE = 48000
# G.711 (mu-law, A-law) is defined at 8 kHz: what phone lines, SIP and Twilio Media Streams carry.
G711_RATE = 8000
# Sane bounds for any rate we encode to or accept from an upload.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000, 384000


class UnsupportedFormat(ValueError):
    """The requested response format is not one we can produce."""


@dataclass(frozen=True)
class AudioFormat:
    """One response format.

    ``sample_rates`` is ``None`` when any positive rate is accepted. ``container``
    and ``codec`` name the PyAV muxer/encoder (``None`` for the formats we write
    ourselves). ``fixed_rate`` forces one output rate regardless of the input.
    For the formats we write ourselves, ``law`` names the G.711 law of the
    samples (``None``: 16-bit little-endian PCM) and ``wav`` says whether they
    come inside a RIFF/WAVE file (else raw, headerless).
    """

    name: str
    content_type: str
    extension: str
    sample_rates: tuple[int, ...] | None
    container: str | None = None
    codec: str | None = None
    fixed_rate: int | None = None
    lossy: bool = False
    law: str | None = None
    wav: bool = False

    @property
    def sample_width(self) -> int:
        """Bytes a sample of the formats we write ourselves (G.711: 1, PCM: 2)."""
        return 1 if self.law else 2

    def accepts_rate(self, rate: int) -> bool:
        if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
            return False
        return self.sample_rates is None or rate in self.sample_rates

    def output_rate(self, rate: int) -> int:
        """The rate this format will actually carry when asked for ``rate``.

        A supported rate is kept; otherwise the lowest supported rate above it
        (so nothing is lost), or the highest one if ``rate`` is above them all.
        """
        if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
            raise ValueError(f"sample rate must be {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz, got {rate}")
        if self.fixed_rate is not None:
            return self.fixed_rate
        if self.accepts_rate(rate):
            return rate
        assert self.sample_rates is not None
        higher = [r for r in self.sample_rates if r > rate]
        return min(higher) if higher else max(self.sample_rates)


FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in (
        AudioFormat("wav", "audio/wav", "wav", None, wav=True),
        AudioFormat("pcm", "audio/pcm", "pcm", None),
        AudioFormat("mp3", "audio/mpeg", "mp3", MPEG_AUDIO_RATES, "mp3", "libmp3lame", lossy=True),
        AudioFormat(
            "opus", "audio/ogg", "opus", OPUS_RATES, "ogg", "libopus", fixed_rate=OPUS_OUTPUT_RATE, lossy=True
        ),
        AudioFormat("aac", "audio/aac", "aac", AAC_RATES, "adts", "aac", lossy=True),
        AudioFormat("flac", "audio/flac", "flac", None, "flac", "flac"),
        # Raw G.711 bytes at 8 kHz. audio/basic is mu-law's registered type (RFC 2046); A-law has no
        # registered type outside RTP (audio/PCMA is RTP-only), audio/x-alaw-basic is the one in use.
        AudioFormat("mulaw", "audio/basic", "ulaw", (G711_RATE,), fixed_rate=G711_RATE, lossy=True, law="mulaw"),
        AudioFormat("alaw", "audio/x-alaw-basic", "alaw", (G711_RATE,), fixed_rate=G711_RATE, lossy=True,
                    law="alaw"),
        # The same in a WAV file (WAVE_FORMAT_MULAW / WAVE_FORMAT_ALAW, with the fact chunk).
        AudioFormat("wav_mulaw", "audio/wav", "wav", (G711_RATE,), fixed_rate=G711_RATE, lossy=True, law="mulaw",
                    wav=True),
        AudioFormat("wav_alaw", "audio/wav", "wav", (G711_RATE,), fixed_rate=G711_RATE, lossy=True, law="alaw",
                    wav=True),
    )
}
FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)


def resolve_format(name: str) -> AudioFormat:
    """Look a format up by name (case-insensitive, surrounding blanks ignored)."""
    key = (name or "").strip().lower() if isinstance(name, str) else ""
    fmt = FORMATS.get(key)
    if fmt is None:
        raise UnsupportedFormat(
            f"unsupported response format {name!r}; use one of: {', '.join(FORMAT_NAMES)}"
        )
    return fmt
