"""Voice library API over the real pool with FakeEngines: register once, use everywhere, persist."""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.engines.fake import FakeVoice
from app.main import create_app
from app.settings import Settings
from tests.support.fake_app import RecordingEngine, hold
from tests.support.sounds import prompt_wav

FAMILY = "fake-1"


def wav(seconds: float = 2.0, rate: int = 16000) -> bytes:
    return prompt_wav(seconds, rate)


def mp3(seconds: float = 2.0) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp3") as out:
        stream = out.add_stream("libmp3lame", rate=22050, layout="mono")
        t = np.arange(int(seconds * 22050)) / 22050
        frame = av.AudioFrame.from_ndarray((0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)[None, :],
                                           format="flt", layout="mono")
        frame.sample_rate = 22050
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


class SlowVoiceEngine(RecordingEngine):
    """Computing a voice takes a while, so concurrent registrations really overlap."""

    def compute_voice(self, prompt_text, audio):
        time.sleep(0.05)
        return super().compute_voice(prompt_text, audio)


@pytest.fixture
def voices_dir(tmp_path):
    return tmp_path / "voices"


@pytest.fixture
def make(tmp_path, voices_dir, behaviour, seen) -> Iterator[Callable[..., TestClient]]:
    """``make(server=..., pool=..., voices=...)``: a started app over the shared voices dir."""
    with ExitStack() as stack:
        def build(server: dict | None = None, pool: dict | None = None, voices: dict | None = None) -> TestClient:
            settings = Settings(
                dev={"fake_engine": True},
                pool={"workers": 2, "max_queue": 8, "queue_timeout_s": 5.0, "request_timeout_s": 30.0, **(pool or {})},
                server={"drain_timeout_s": 5, **(server or {})},
                voices={"dir": str(voices_dir), **(voices or {})},
            )
            app = create_app(settings, engine_factory=lambda i: SlowVoiceEngine(behaviour, seen))
            client = TestClient(app)
            stack.enter_context(client)
            stack.callback(lambda: behaviour.gate.set() if behaviour.gate is not None else None)
            return client

        yield build


def register(client: TestClient, name: str = "alice", audio: bytes | None = None, filename: str = "a.wav",
             **fields: Any):
    data = {"name": name, "transcript": "hello there, this is my voice", **fields}
    return client.post("/v1/voices", data={k: v for k, v in data.items() if v is not None},
                       files={"audio": (filename, wav() if audio is None else audio, "application/octet-stream")})


def on_disk(voices_dir) -> list[str]:
    return sorted(str(p.relative_to(voices_dir)) for p in voices_dir.rglob("*"))


def error(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code, err
    assert err["message"]
    return err


def test_register_list_get_synthesise_delete(make, voices_dir, behaviour, seen):
    client = make()
    r = register(client, description="calm narrator", audio=mp3(), filename="Clip.MP3")
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/v1/voices/alice"
    card = r.json()
    assert card["name"] == "alice" and card["description"] == "calm narrator"
    assert card["transcript"] == "hello there, this is my voice"
    assert card["sample_rate"] == 16000 and 1.9 < card["duration_s"] < 2.2
    assert len(card["audio_sha256"]) == 64 and card["created_at"].endswith("Z")
    assert behaviour.voices_computed == 1

    assert client.get("/v1/voices").json() == {"voices": [card]}
    assert client.get("/v1/voices/alice").json() == card
    assert "alice" in client.get("/v1/speakers").json()["voices"]
    assert on_disk(voices_dir) == ["alice", "alice/features", f"alice/features/{FAMILY}.bin", "alice/meta.json",
                                   "alice/original.mp3", "alice/prompt.wav"]
    assert (voices_dir / "alice" / "original.mp3").read_bytes()[:3] in (b"ID3", b"\xff\xfb", b"\xff\xf3")
    meta = json.loads((voices_dir / "alice" / "meta.json").read_text())
    assert {k: meta[k] for k in card} == card

    for _ in range(3):
        r = client.post("/v1/tts", json={"text": "hello", "voice": "alice"})
        assert r.status_code == 200, r.text
    r = client.post("/v1/tts", json={"text": "hello", "speaker": "alice", "stream": True, "format": "pcm"})
    assert r.status_code == 200, r.text
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "hello", "voice": "alice"})
    assert r.status_code == 200, r.text
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "hello", "voice": {"id": "alice"}})
    assert r.status_code == 200, r.text
    assert behaviour.voices_computed == 1  # never recomputed per request
    assert len(seen) == 6
    for req in seen:
        assert req.mode == "zero_shot" and req.prompt_audio is None
        assert req.voice == FakeVoice(family=FAMILY, prompt_text="hello there, this is my voice", level=req.voice.level)
    assert len({id(req.voice) for req in seen}) == 1  # one shared object for every slot and request

    assert client.delete("/v1/voices/alice").status_code == 204
    error(client.get("/v1/voices/alice"), 404, "voice_not_found")
    error(client.delete("/v1/voices/alice"), 404, "voice_not_found")
    assert client.get("/v1/voices").json() == {"voices": []}
    error(client.post("/v1/tts", json={"text": "hi", "voice": "alice"}), 400, "unknown_voice")
    assert on_disk(voices_dir) == []
    # the name is free again
    assert register(client).status_code == 201
    assert behaviour.voices_computed == 2


BAD_UPLOADS: list[tuple[str, dict, int, str]] = [
    ("traversal_name", {"name": "../x"}, 400, "invalid_name"),
    ("slash_name", {"name": "a/b"}, 400, "invalid_name"),
    ("dot_name", {"name": ".tmp-x"}, 400, "invalid_name"),
    ("long_name", {"name": "x" * 65}, 400, "invalid_name"),
    ("missing_name", {"name": None}, 400, "invalid_name"),
    ("missing_transcript", {"transcript": None}, 400, "invalid_transcript"),
    ("blank_transcript", {"transcript": "   "}, 400, "invalid_transcript"),
    ("long_transcript", {"transcript": "x" * 5000}, 400, "invalid_transcript"),
    ("undecodable", {"audio": b"this is not audio at all " * 40}, 400, "invalid_audio"),
    ("empty_file", {"audio": b""}, 400, "invalid_audio"),
    ("too_short", {"audio": wav(0.5)}, 400, "invalid_audio"),
    ("too_long", {"audio": wav(31.0, 8000)}, 400, "invalid_audio"),
    ("too_large", {"audio": wav(25.0, 24000)}, 413, "payload_too_large"),
    ("missing_file", {"audio": None}, 400, "invalid_audio"),
    ("unknown_field", {"colour": "blue"}, 422, "validation_error"),
]


@pytest.mark.parametrize("fields, status, code", [c[1:] for c in BAD_UPLOADS], ids=[c[0] for c in BAD_UPLOADS])
def test_bad_uploads_are_refused_and_nothing_is_written(make, voices_dir, behaviour, fields, status, code):
    client = make(server={"max_upload_mb": 1})  # 25 s of 24 kHz WAV is 1.2 MB; 31 s of 8 kHz is 0.5 MB
    data = {"name": "alice", "transcript": "hello there"}
    audio = fields.pop("audio", wav())
    data.update(fields)
    files = {"audio": ("a.wav", audio, "audio/wav")} if audio is not None else None
    r = client.post("/v1/voices", data={k: v for k, v in data.items() if v is not None}, files=files,
                    headers={"X-Request-ID": "rid-voice"})
    err = error(r, status, code)
    assert err["request_id"] == "rid-voice"
    assert on_disk(voices_dir) == []
    assert behaviour.voices_computed == 0
    assert client.get("/v1/voices").json() == {"voices": []}
    assert register(client).status_code == 201  # nothing was left reserved


def test_json_body_without_audio_is_refused(make, voices_dir):
    client = make()
    error(client.post("/v1/voices", json={"name": "alice", "transcript": "hi"}), 400, "invalid_audio")
    assert on_disk(voices_dir) == []


def test_duplicate_and_preset_names_conflict(make, voices_dir, behaviour):
    client = make()
    assert register(client).status_code == 201
    before = (voices_dir / "alice" / "meta.json").read_bytes()
    error(register(client, transcript="another"), 409, "voice_exists")
    error(register(client, name="fake_female"), 409, "voice_exists")
    assert (voices_dir / "alice" / "meta.json").read_bytes() == before
    assert behaviour.voices_computed == 1
    assert sorted(p.name for p in voices_dir.iterdir()) == ["alice"]


def test_voice_limit(make, voices_dir):
    client = make(voices={"max_voices": 2})
    assert register(client, name="a").status_code == 201
    assert register(client, name="b").status_code == 201
    err = error(register(client, name="c"), 409, "voice_limit_reached")
    assert "2 voices" in err["message"]
    assert client.delete("/v1/voices/a").status_code == 204
    assert register(client, name="c").status_code == 201
    assert sorted(p.name for p in voices_dir.iterdir()) == ["b", "c"]


def _race(calls: list[Callable[[], Any]]) -> list[Any]:
    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        start.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_concurrent_registrations_of_different_names_all_succeed(make, voices_dir, behaviour):
    client = make()
    names = [f"voice_{i}" for i in range(8)]
    results = _race([lambda n=n: register(client, name=n) for n in names])
    assert [r.status_code for r in results] == [201] * 8, [r.text for r in results]
    assert client.get("/v1/voices").json()["voices"] == [r.json() for r in results]
    assert behaviour.voices_computed == 8
    assert sorted(p.name for p in voices_dir.iterdir()) == names
    for n in names:
        assert client.post("/v1/tts", json={"text": "hi", "voice": n}).status_code == 200


def test_concurrent_registrations_of_one_name_exactly_one_wins(make, voices_dir, behaviour):
    client = make()
    results = _race([lambda i=i: register(client, transcript=f"take {i}") for i in range(8)])
    codes = sorted(r.status_code for r in results)
    assert codes == [201] + [409] * 7, [r.text for r in results]
    winner = next(r.json() for r in results if r.status_code == 201)
    assert client.get("/v1/voices").json() == {"voices": [winner]}
    assert behaviour.voices_computed == 1  # losers were refused before any engine work
    assert sorted(p.name for p in voices_dir.iterdir()) == ["alice"]


def test_overload_while_computing_is_503_and_writes_nothing(make, voices_dir, behaviour):
    client = make(pool={"workers": 1, "max_queue": 0})
    gate = hold(behaviour)
    busy = threading.Thread(target=lambda: client.post("/v1/tts", json={"text": "hold the only slot"}))
    busy.start()
    deadline = time.monotonic() + 5
    while not behaviour.started and time.monotonic() < deadline:
        time.sleep(0.01)
    r = register(client)
    error(r, 503, "overloaded")
    assert int(r.headers["retry-after"]) >= 1
    gate.set()
    busy.join(10)
    assert on_disk(voices_dir) == []
    assert register(client).status_code == 201  # the name was released


def test_engine_failure_while_computing_is_500_and_writes_nothing(make, voices_dir, behaviour):
    client = make()
    behaviour.fail_on_voice = True
    err = error(register(client), 500, "voice_compute_failed")
    assert "fake engine" not in err["message"]
    assert on_disk(voices_dir) == []
    behaviour.fail_on_voice = False
    assert register(client).status_code == 201


def test_voices_survive_a_restart_without_recomputing(make, voices_dir, behaviour, seen):
    first = make()
    card = register(first).json()
    first.__exit__(None, None, None)
    second = make()
    assert second.get("/v1/voices").json() == {"voices": [card]}
    r = second.post("/v1/tts", json={"text": "hello again", "voice": "alice"})
    assert r.status_code == 200, r.text
    assert behaviour.voices_computed == 1  # imported from features/, not recomputed
    assert seen[-1].voice.prompt_text == card["transcript"]


def _write_corrupt_entries(voices_dir) -> None:
    (voices_dir / "broken").mkdir()
    (voices_dir / "broken" / "meta.json").write_text("{not json")
    (voices_dir / "empty").mkdir()
    bad_blob = voices_dir / "badblob"
    bad_blob.mkdir()
    for f in ("prompt.wav", "original.wav"):
        (bad_blob / f).write_bytes((voices_dir / "alice" / f).read_bytes())
    meta = json.loads((voices_dir / "alice" / "meta.json").read_text())
    (bad_blob / "meta.json").write_text(json.dumps({**meta, "name": "badblob"}))
    (bad_blob / "features").mkdir()
    (bad_blob / "features" / f"{FAMILY}.bin").write_bytes(b"\x00garbage")
    (voices_dir / ".tmp-0123abcd").mkdir()
    (voices_dir / ".tmp-0123abcd" / "prompt.wav").write_bytes(b"half a registration")
    (voices_dir / "alice" / "features" / f".tmp-99-{FAMILY}.bin").write_bytes(b"half a write")
    (voices_dir / "README.txt").write_text("not a voice")
    old = time.time() - 3600  # leftovers of a crash an hour ago (young ones may be another replica's write)
    for leftover in (voices_dir / ".tmp-0123abcd", voices_dir / "alice" / "features" / f".tmp-99-{FAMILY}.bin"):
        os.utime(leftover, (old, old))


def test_corrupt_entries_and_leftovers_are_skipped_at_startup(make, voices_dir, behaviour, caplog):
    first = make()
    card = register(first).json()
    first.__exit__(None, None, None)
    _write_corrupt_entries(voices_dir)
    with caplog.at_level(logging.INFO, logger="cosyserve.voices"):
        client = make()
    assert client.get("/health/ready").status_code == 200
    assert client.get("/v1/voices").json() == {"voices": [card]}
    log = caplog.text
    for needle in ("'broken'", "'empty'", "'badblob'", ".tmp-0123abcd", f".tmp-99-{FAMILY}.bin", "README.txt"):
        assert needle in log, needle
    assert not list(voices_dir.rglob(".tmp-*"))
    assert behaviour.voices_computed == 1
    assert client.post("/v1/tts", json={"text": "hi", "voice": "alice"}).status_code == 200
    error(client.post("/v1/tts", json={"text": "hi", "voice": "broken"}), 400, "unknown_voice")
    error(register(client, name="broken"), 409, "voice_exists")  # its files are still there
    assert client.delete("/v1/voices/broken").status_code == 204  # ... until deleted
    assert not (voices_dir / "broken").exists()
    assert register(client, name="broken").status_code == 201


def test_features_of_another_family_are_recomputed_from_the_stored_prompt(make, voices_dir, behaviour, seen):
    first = make()
    register(first)
    first.__exit__(None, None, None)
    features = voices_dir / "alice" / "features"
    (features / f"{FAMILY}.bin").rename(features / "othermodel-123.bin")
    client = make()
    assert behaviour.voices_computed == 2
    assert sorted(p.name for p in features.iterdir()) == [f"{FAMILY}.bin", "othermodel-123.bin"]
    assert client.post("/v1/tts", json={"text": "hi", "voice": "alice"}).status_code == 200
    assert seen[-1].voice.prompt_text == "hello there, this is my voice"
    client.__exit__(None, None, None)
    make()  # the recomputed features were stored: no third computation
    assert behaviour.voices_computed == 2


def test_a_voice_that_cannot_be_recomputed_is_skipped_not_fatal(make, voices_dir, behaviour, caplog):
    first = make()
    register(first)
    register(first, name="bob")
    first.__exit__(None, None, None)
    (voices_dir / "alice" / "features" / f"{FAMILY}.bin").unlink()
    behaviour.fail_on_voice = True
    with caplog.at_level(logging.ERROR, logger="cosyserve.voices"):
        client = make()
    assert [v["name"] for v in client.get("/v1/voices").json()["voices"]] == ["bob"]
    assert "'alice'" in caplog.text and "computing them from its prompt failed" in caplog.text
    assert (voices_dir / "alice" / "prompt.wav").exists()  # kept for a later start
