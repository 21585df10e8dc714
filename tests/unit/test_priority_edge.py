"""The edge's class sniffing (app/api/priority.py) and the keys file's ``priority=`` option (app/settings/keys.py)."""

from __future__ import annotations

import pytest

from app.api.priority import body_priority, client_of, header_priority
from app.serving.admission.classes import Priority
from app.serving.errors import BadRequest
from app.settings import read_keys_file


def scope(ctype: str = "application/json", query: bytes = b"", **headers: str) -> dict:
    raw = [(b"content-type", ctype.encode())] + [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "headers": raw, "query_string": query, "client": ("10.0.0.7", 5000)}


@pytest.mark.parametrize("body,expected", [
    (b'{"text": "hi", "priority": "bulk"}', Priority.BULK),
    (b'{"text": "hi", "priority": " Interactive "}', Priority.INTERACTIVE),
    (b'{"text": "the priority is ours"}', None),  # mentioned, not a field
    (b'{"text": "hi", "voice": {"priority": "bulk"}}', None),  # not top level
    (b'{"text": "hi", "priority": "urgent"}', None),  # invalid: the router's schema says so
    (b'{"priority": "bulk"', None),  # not JSON: the router says so
    (b"[1, 2]", None),
    (b'{"text": "hi"}', None),
])
def test_json_body(body, expected):
    assert body_priority(scope(), body) is expected


def test_urlencoded_and_query():
    form = scope("application/x-www-form-urlencoded")
    assert body_priority(form, b"tts_text=hi&priority=bulk") is Priority.BULK
    assert body_priority(form, b"tts_text=priority") is None
    assert body_priority(scope(query=b"tts_text=hi&priority=bulk"), b"") is Priority.BULK
    assert body_priority(scope(query=b"tts_text=hi"), b"") is None


def multipart(*parts: tuple[str, str | None, bytes]) -> bytes:
    out = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--XyZ\r\nContent-Disposition: {disposition}\r\n".encode()
        if filename:
            out += b"Content-Type: audio/wav\r\n"
        out += b"\r\n" + value + b"\r\n"
    return out + b"--XyZ--\r\n"


def test_multipart_field_not_a_file_named_so():
    ctype = "multipart/form-data; boundary=XyZ"
    body = multipart(("text", None, b"hi"), ("prompt_audio", "priority", b"RIFF priority=bulk"),
                     ("priority", None, b"bulk"))
    assert body_priority(scope(ctype), body) is Priority.BULK
    body = multipart(("text", None, b"priority"), ("prompt_audio", "priority", b"RIFF"))
    assert body_priority(scope(ctype), body) is None
    assert body_priority(scope('multipart/form-data; boundary="XyZ"'), multipart(("priority", None, b"Bulk"))) \
        is Priority.BULK


def test_header_and_client():
    assert header_priority(scope()) is None
    assert header_priority(scope(x_priority="bulk")) is Priority.BULK
    with pytest.raises(BadRequest) as exc:
        header_priority(scope(x_priority="urgent"))
    assert exc.value.code == "invalid_priority" and exc.value.param == "X-Priority"
    assert client_of(scope(), "key-0123abcd") == "key-0123abcd"
    assert client_of(scope(), None) == "10.0.0.7"


def test_keys_file_priority_option(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# comment\nk-one\nk-two priority=bulk\n  k-three   priority=Interactive  \n")
    assert read_keys_file(str(path)) == {"k-one": None, "k-two": "bulk", "k-three": "interactive"}
    for line in ("k-secret priority=urgent", "k-secret colour=blue"):
        path.write_text(line + "\n")
        with pytest.raises(ValueError) as exc:
            read_keys_file(str(path))
        assert "line 1" in str(exc.value) and "k-secret" not in str(exc.value)
