"""VoiceStore: layout, crash-safe writes, cleanup of leftovers, corrupt entries."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import numpy as np
import pytest

from app.engines.base import PromptAudio
from app.voices import store as store_module
from app.voices.store import (
    CorruptVoice,
    VoiceStore,
    atomic_write,
    decode_wav,
    encode_wav,
    safe_ext,
    valid_name,
)


class Crash(Exception):
    pass


def _audio(seconds: float = 1.5, rate: int = 16000) -> PromptAudio:
    t = np.arange(int(seconds * rate)) / rate
    return PromptAudio((0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), rate)


def _meta(name: str = "alice") -> dict:
    return {"name": name, "transcript": "hello there", "description": "", "created_at": "2024-01-01T00:00:00Z",
            "audio_sha256": "0" * 64, "sample_rate": 16000, "duration_s": 1.5, "original_file": "original.mp3"}


def _create(store: VoiceStore, name: str = "alice", features: dict | None = None) -> None:
    store.create(_meta(name), b"ORIGINAL", "mp3", encode_wav(_audio()), features or {"fam-1": b"FEATURES"})


def _leftovers(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".tmp-*"))


def test_atomic_write_replaces_the_file(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write(target, b"one")
    atomic_write(target, lambda f: f.write(b"two"))
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_atomic_write_crash_after_writing_leaves_no_file_and_no_temp(tmp_path):
    target = tmp_path / "f.bin"
    seen = []

    def write_then_crash(f) -> None:
        f.write(b"x" * 10000)
        f.flush()
        seen.extend(p.name for p in tmp_path.iterdir())  # the temp file is really there
        raise Crash("power cut")

    with pytest.raises(Crash):
        atomic_write(target, write_then_crash)
    assert len(seen) == 1 and seen[0].startswith(".tmp-")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_crash_keeps_the_old_content(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write(target, b"old")

    def crash(f) -> None:
        f.write(b"new")
        raise Crash("power cut")

    with pytest.raises(Crash):
        atomic_write(target, crash)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_create_writes_the_layout_and_reads_back(tmp_path):
    store = VoiceStore(tmp_path / "voices")
    _create(store)
    base = tmp_path / "voices" / "alice"
    assert sorted(p.name for p in base.iterdir()) == ["features", "meta.json", "original.mp3", "prompt.wav"]
    assert (base / "original.mp3").read_bytes() == b"ORIGINAL"
    assert json.loads((base / "meta.json").read_text())["name"] == "alice"
    stored = store.read("alice")
    assert stored.meta == _meta() and stored.features == {"fam-1": b"FEATURES"}
    prompt = store.read_prompt("alice")
    assert prompt.sample_rate == 16000 and len(prompt.samples) == 24000
    assert np.max(np.abs(prompt.samples - _audio().samples)) < 1e-3
    assert store.entries() == ["alice"]
    assert _leftovers(tmp_path) == []


def test_create_crash_midway_leaves_no_voice_and_no_temp_dir(tmp_path):
    store = VoiceStore(tmp_path)
    bad_features = {"fam-1": b"ok", "../escape": b"x"}  # the second write fails after the first succeeded
    with pytest.raises(ValueError):
        _create(store, features=bad_features)
    assert list(tmp_path.iterdir()) == []


def test_create_refuses_an_existing_name(tmp_path):
    store = VoiceStore(tmp_path)
    _create(store)
    with pytest.raises(FileExistsError):
        _create(store, features={"fam-2": b"OTHER"})
    assert store.read("alice").features == {"fam-1": b"FEATURES"}
    assert _leftovers(tmp_path) == []


def test_write_features_adds_a_family(tmp_path):
    store = VoiceStore(tmp_path)
    _create(store)
    store.write_features("alice", "fam-2", b"TWO")
    assert store.read("alice").features == {"fam-1": b"FEATURES", "fam-2": b"TWO"}
    with pytest.raises(ValueError):
        store.write_features("alice", "../../etc", b"x")


def test_delete_removes_everything(tmp_path):
    store = VoiceStore(tmp_path)
    _create(store)
    store.delete("alice")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        store.delete("alice")


def test_clean_temp_removes_leftovers_only(tmp_path):
    store = VoiceStore(tmp_path)
    _create(store)
    (tmp_path / ".tmp-dead").mkdir()
    (tmp_path / ".tmp-dead" / "meta.json").write_text("{}")
    (tmp_path / ".tmp-deleted-1").mkdir()
    (tmp_path / "alice" / "features" / ".tmp-123-fam-2.bin").write_bytes(b"half")
    removed = store.clean_temp()
    assert sorted(removed) == [".tmp-dead", ".tmp-deleted-1", "alice/features/.tmp-123-fam-2.bin"]
    assert _leftovers(tmp_path) == []
    assert store.read("alice").features == {"fam-1": b"FEATURES"}


def test_entries_ignore_files_and_bad_names(tmp_path):
    store = VoiceStore(tmp_path)
    _create(store)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "bad name").mkdir()
    (tmp_path / ".hidden").mkdir()
    assert store.entries() == ["alice"]


@pytest.mark.parametrize("damage, why", [
    (lambda b: (b / "meta.json").write_text("{not json"), "unreadable"),
    (lambda b: (b / "meta.json").unlink(), "missing"),
    (lambda b: (b / "meta.json").write_text(json.dumps({"name": "alice"})), "lacks"),
    (lambda b: (b / "meta.json").write_text(json.dumps(_meta("bob"))), "names 'bob'"),
    (lambda b: (b / "prompt.wav").unlink(), "prompt.wav is missing"),
])
def test_read_reports_corrupt_entries(tmp_path, damage, why):
    store = VoiceStore(tmp_path)
    _create(store)
    damage(tmp_path / "alice")
    with pytest.raises(CorruptVoice, match=why):
        store.read("alice")


def test_unreadable_prompt_is_corrupt(tmp_path):
    store = VoiceStore(tmp_path)
    _create(store)
    (tmp_path / "alice" / "prompt.wav").write_bytes(b"RIFFjunk")
    with pytest.raises(CorruptVoice, match="prompt.wav"):
        store.read_prompt("alice")


def test_names_and_extensions():
    assert valid_name("a") and valid_name("A-b_9" * 12) and valid_name("x" * 64)
    for bad in ("", "x" * 65, "../x", "a/b", "a b", ".hidden", "é", "a.b"):
        assert not valid_name(bad), bad
    with pytest.raises(ValueError):
        VoiceStore("/tmp").path("../x")
    assert safe_ext("Clip.MP3") == "mp3" and safe_ext("a.tar.gz") == "gz"
    assert safe_ext(None) == safe_ext("noext") == safe_ext("x.../../etc") == safe_ext("a.verylongext") == "bin"


def test_wav_round_trip_is_16_bit():
    audio = _audio(1.0)
    data = encode_wav(audio)
    assert data[:4] == b"RIFF" and len(data) == 44 + 2 * 16000
    back = decode_wav(data)
    assert back.sample_rate == 16000 and back.samples.dtype == np.float32
    assert decode_wav(encode_wav(back)).samples.tolist() == back.samples.tolist()


# -- several processes on one root (replicas on a shared volume) ----------------------------------
def _race(root: str, names: list[str], start, out) -> None:
    """In a child process: create every name as fast as possible; report which ones this process won."""
    store = VoiceStore(root)
    start.wait()
    won = []
    for name in names:
        try:
            store.create(_meta(name), f"ORIGINAL {os.getpid()}".encode(), "mp3", encode_wav(_audio(0.1)),
                         {"fam-1": str(os.getpid()).encode()})
            won.append(name)
        except FileExistsError:
            pass
    out.put((os.getpid(), won))


def test_two_processes_racing_for_the_same_names_each_name_won_exactly_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    names = [f"v{i}" for i in range(40)]
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), names, start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    won = [n for names_won in results.values() for n in names_won]
    assert sorted(won) == sorted(names)  # every name exactly once, never twice
    store = VoiceStore(tmp_path)
    for pid, names_won in results.items():
        for name in names_won:  # the winner's files, whole, never a mix of both writers
            stored = store.read(name)
            assert stored.features == {"fam-1": str(pid).encode()}
            assert (tmp_path / name / "original.mp3").read_bytes() == f"ORIGINAL {pid}".encode()
    assert _leftovers(tmp_path) == []


def test_the_rename_decides_when_another_process_wins_after_the_existence_check(tmp_path, monkeypatch):
    other = VoiceStore(tmp_path)
    real_rename = os.rename

    def rename_after_the_other_process(src, dst):  # the other replica commits in between check and rename
        if str(dst).endswith("alice"):
            monkeypatch.setattr(store_module.os, "rename", real_rename)
            _create(other, features={"fam-1": b"THE OTHER ONE"})
        return real_rename(src, dst)

    monkeypatch.setattr(store_module.os, "rename", rename_after_the_other_process)
    with pytest.raises(FileExistsError):
        _create(VoiceStore(tmp_path), features={"fam-1": b"MINE"})
    assert VoiceStore(tmp_path).read("alice").features == {"fam-1": b"THE OTHER ONE"}
    assert _leftovers(tmp_path) == []


def test_clean_temp_with_an_age_leaves_young_writes_of_other_processes_alone(tmp_path):
    store = VoiceStore(tmp_path)
    _create(store)
    (tmp_path / ".tmp-young").mkdir()
    (tmp_path / ".tmp-old").mkdir()
    (tmp_path / ".tmp-deleted-young").mkdir()
    old = time.time() - 3600
    os.utime(tmp_path / ".tmp-old", (old, old))
    assert sorted(store.clean_temp(min_age_s=600)) == [".tmp-deleted-young", ".tmp-old"]
    assert _leftovers(tmp_path) == [".tmp-young"]


def test_listing_and_stamp_follow_changes_made_through_another_store(tmp_path):
    mine, theirs = VoiceStore(tmp_path), VoiceStore(tmp_path)
    before = mine.stamp()
    assert mine.listing() == {}
    _create(theirs)
    first = mine.listing()
    assert list(first) == ["alice"] and first["alice"] == mine.token("alice")
    assert mine.stamp() != before
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".tmp-x").mkdir()
    assert list(mine.listing()) == ["alice"]
    theirs.delete("alice")
    assert mine.listing() == {} and mine.token("alice") is None
    _create(theirs)  # registered again under the same name: a new identity, even if an inode is reused
    assert mine.listing()["alice"] == mine.token("alice") != first["alice"]
    (tmp_path / "alice" / "features" / "fam-2.bin").write_bytes(b"more")  # features added later: same voice
    assert mine.listing()["alice"] == mine.token("alice")
