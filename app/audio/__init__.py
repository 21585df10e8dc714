"""Audio I/O for the server: output formats, resampling, encoding, decoding.

No web-framework or torch imports here; everything works on numpy arrays and bytes.
"""

from app.audio.decode import AudioDecodeError, AudioTooLong, decode_audio
from app.audio.encode import Encoder, encode_whole, make_encoder
from app.audio.formats import (
    FORMAT_NAMES,
    FORMATS,
    AudioFormat,
    UnsupportedFormat,
    resolve_format,
)
from app.audio.resample import StreamResampler, resample_int16

__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "AudioDecodeError",
    "AudioFormat",
    "AudioTooLong",
    "Encoder",
    "StreamResampler",
    "UnsupportedFormat",
    "decode_audio",
    "encode_whole",
    "make_encoder",
    "resample_int16",
    "resolve_format",
]
