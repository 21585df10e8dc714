"""app/logredact.py: every shape in which a key reaches a log line comes out masked."""

from __future__ import annotations

import io
import logging

import pytest

from app.logredact import MASK, Redactor, install, redact

KEY = "sk-Zq81Lm0Vx7Ty"


@pytest.mark.parametrize(("line", "kept"), [
    (f"< GET /v1/audio/speech/stream?api_key={KEY} HTTP/1.1", "< GET /v1/audio/speech/stream?api_key=*** HTTP/1.1"),
    (f"< GET /x?voice=a&api_key={KEY}&y=1 HTTP/1.1", "< GET /x?voice=a&api_key=***&y=1 HTTP/1.1"),
    (f"GET /x?access_token={KEY}", "GET /x?access_token=***"),
    (f"< x-api-key: {KEY}", "< x-api-key: ***"),
    (f"< X-API-Key:{KEY}", "< X-API-Key:***"),
    (f"< authorization: Bearer {KEY}", "< authorization: ***"),
    (f"< Proxy-Authorization: Basic {KEY}", "< Proxy-Authorization: ***"),
    (f"scope={{'headers': [(b'host', b'h'), (b'authorization', b'Bearer {KEY}'), (b'x-api-key', b'{KEY}')]}}",
     "scope={'headers': [(b'host', b'h'), (b'authorization', b'***'), (b'x-api-key', b'***')]}"),
])
def test_each_shape_of_a_credential_is_masked(line, kept):
    assert redact(line) == kept


def test_configured_keys_are_masked_anywhere_and_other_text_is_kept():
    line = f"text was 'my key is {KEY}, say it' (no header, no query)"
    assert redact(line, [KEY]) == f"text was 'my key is {MASK}, say it' (no header, no query)"
    plain = "GET /v1/tts 200 12.0ms authorization checked; keyboard=1 ttfa=-"
    assert redact(plain, [KEY]) == plain


def test_the_filter_masks_formatted_args_and_tracebacks_on_a_real_handler():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("tests.logredact")
    logger.propagate, logger.level = False, logging.DEBUG
    logger.addHandler(handler)
    handler.addFilter(Redactor([KEY]))
    try:
        logger.debug("< %s: %s", "x-api-key", KEY)
        logger.debug("< GET %s HTTP/1.1", f"/s?api_key={KEY}")
        try:
            raise ValueError(f"bad key {KEY}")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert KEY not in text
    assert "DEBUG < x-api-key: ***" in text and "api_key=*** HTTP/1.1" in text
    assert "ValueError: bad key ***" in text


def test_install_covers_the_root_handlers_and_the_uvicorn_loggers_once():
    root = logging.getLogger()
    handler = logging.StreamHandler(io.StringIO())
    root.addHandler(handler)
    try:
        install([KEY])
        install([KEY])  # replaces, never stacks
        assert sum(isinstance(f, Redactor) for f in handler.filters) == 1
        assert sum(isinstance(f, Redactor) for f in logging.getLogger("uvicorn.error").filters) == 1
    finally:
        root.removeHandler(handler)
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "websockets", "websockets.server",
                     "websockets.protocol", "cosyserve", "cosyserve.access", "cosyserve.ws"):
            lg = logging.getLogger(name)
            for f in [f for f in lg.filters if isinstance(f, Redactor)]:
                lg.removeFilter(f)
