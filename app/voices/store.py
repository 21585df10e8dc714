"""On-disk layout of the voice library, with crash-safe writes.

One voice is one directory::

    <root>/<name>/
        meta.json                 name, transcript, description, created_at, audio_sha256, ...
        original.<ext>            the uploaded bytes, exactly as received
        prompt.wav                the decoded prompt we use: 16 kHz mono, 16-bit PCM
        features/<family>.bin     engine.export_voice() bytes, one file per voice family

A new voice is written completely into ``<root>/.tmp-<uuid>/`` (every file
fsynced) and then renamed to ``<root>/<name>`` in one step, so a crash leaves
either the whole voice or nothing under its name; leftover ``.tmp-*`` entries
are removed by :meth:`VoiceStore.clean_temp` at startup. Single files written
later (features for another family) use :func:`atomic_write`. Deleting renames
the directory to a ``.tmp-`` name first, so a half-deleted voice is never seen.

Several processes (replicas on one shared volume) may use one root at once.
Claiming a name is the final ``rename(2)`` itself: renaming a directory onto an
existing *non-empty* directory fails (EEXIST/ENOTEMPTY) atomically, and a voice
directory is never empty, so of two processes racing for one name exactly one
wins. rename is a single server-side operation on NFS, CephFS and EFS too,
where ``renameat2(RENAME_NOREPLACE)`` is not supported and a separate
check-then-act would race. ``clean_temp`` leaves young ``.tmp-`` entries alone:
they may be another process's registration in progress. :meth:`VoiceStore.listing`
(name -> identity of its meta.json) and :meth:`VoiceStore.stamp` let a process notice
what the others changed without reading every voice again.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf

from app.engines.base import PromptAudio

log = logging.getLogger("cosyserve.voices")

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
TEMP_PREFIX = ".tmp-"
DELETED_PREFIX = f"{TEMP_PREFIX}deleted-"
META_FILE = "meta.json"
PROMPT_FILE = "prompt.wav"
FEATURES_DIR = "features"
_EXT_RE = re.compile(r"[a-z0-9]{1,8}")
_FAMILY_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
Writer = Callable[[BinaryIO], None]
Token = tuple[int, int]
META_KEYS = ("name", "transcript", "description", "created_at", "audio_sha256", "sample_rate", "duration_s")


class CorruptVoice(Exception):
    """A voice directory that cannot be loaded; the message says why."""


def valid_name(name: str) -> bool:
    return isinstance(name, str) and NAME_RE.fullmatch(name) is not None


def safe_ext(filename: str | None) -> str:
    """The upload's file extension, if it is a plain short one; else ``bin``."""
    ext = Path(filename or "").suffix.lstrip(".").lower()
    return ext if _EXT_RE.fullmatch(ext) else "bin"


def _check_family(family: str) -> str:
    if not _FAMILY_RE.fullmatch(family or "") or family.startswith("."):
        raise ValueError(f"invalid voice family {family!r}")
    return family


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes | Writer) -> None:
    with open(path, "xb") as f:
        if callable(data):
            data(f)
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write(path: Path, data: bytes | Writer) -> None:
    """Replace ``path`` atomically: temp file in the same dir, write, flush, fsync, rename, fsync the dir.

    ``data`` is the bytes, or a function that writes them to the open temp file. If
    anything fails before the rename, ``path`` is untouched and the temp file is removed.
    """
    path = Path(path)
    tmp = path.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}-{path.name}"
    try:
        _write_synced(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def encode_wav(audio: PromptAudio) -> bytes:
    """16-bit PCM WAV of ``audio`` (what ``prompt.wav`` holds); ``decode_wav(encode_wav(x))`` is stable."""
    x = np.nan_to_num(np.asarray(audio.samples, dtype=np.float64).reshape(-1), nan=0.0, posinf=1.0, neginf=-1.0)
    pcm = np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16)
    buf = io.BytesIO()
    sf.write(buf, pcm, audio.sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def decode_wav(data: bytes) -> PromptAudio:
    pcm, rate = sf.read(io.BytesIO(data), dtype="int16", always_2d=False)
    if pcm.ndim != 1:
        raise ValueError("prompt.wav is not mono")
    return PromptAudio(samples=(pcm.astype(np.float32) / 32768.0), sample_rate=int(rate))


@dataclass
class StoredVoice:
    """One voice as read from disk (features as exported bytes, per family)."""

    meta: dict
    features: dict[str, bytes] = field(default_factory=dict)


class VoiceStore:
    """Reads and writes voice directories under ``root``. Blocking: call it off the event loop."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def path(self, name: str) -> Path:
        if not valid_name(name):
            raise ValueError(f"invalid voice name {name!r}")
        return self.root / name

    # -- startup ---------------------------------------------------------------------------------
    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def clean_temp(self, min_age_s: float = 0.0) -> list[str]:
        """Remove leftovers of interrupted registrations, deletions and writes; return their names.

        With ``min_age_s`` only entries last modified that long ago go (a deletion's
        ``.tmp-deleted-`` directory always goes): on a shared root a young one may be
        another process's write in progress.
        """
        removed = []
        candidates = list(self.root.glob(f"{TEMP_PREFIX}*"))
        for name in self.entries(quiet=True):
            candidates += list((self.root / name / FEATURES_DIR).glob(f"{TEMP_PREFIX}*"))
        cutoff = time.time() - min_age_s
        for entry in candidates:
            if min_age_s > 0 and not entry.name.startswith(DELETED_PREFIX):
                try:
                    if entry.lstat().st_mtime > cutoff:
                        continue
                except FileNotFoundError:  # another process cleaned or renamed it meanwhile
                    continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(str(entry.relative_to(self.root)))
        return removed

    def entries(self, quiet: bool = False) -> list[str]:
        """Names of the directories that look like voices (anything else is logged and ignored)."""
        names = []
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith("."):
                continue
            if not valid_name(entry.name) or not entry.is_dir() or entry.is_symlink():
                if not quiet:
                    log.warning("voice library: ignoring %s (not a voice directory)", entry)
                continue
            names.append(entry.name)
        return names

    def listing(self) -> dict[str, Token]:
        """Voice directory name -> its :meth:`token`, from one directory read and one stat per voice.

        A name whose token changed was deleted and registered again (maybe by another process).
        """
        out: dict[str, Token] = {}
        try:
            with os.scandir(self.root) as it:
                names = [e.name for e in it if not e.name.startswith(".") and valid_name(e.name)
                         and e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return out
        for name in names:
            token = self.token(name)
            if token is not None:
                out[name] = token
        return out

    def stamp(self) -> tuple[int, int, int] | None:
        """Changes whenever an entry is added, removed or renamed under the root (one stat call)."""
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

    def token(self, name: str) -> Token | None:
        """Identity of one registration of ``name``: inode and mtime of its meta.json, never rewritten.

        (A bare directory inode is not enough: a filesystem reuses a deleted voice's inode for the
        next one.) The directory's own, for a broken voice without meta.json; None if it is gone.
        """
        base = self.path(name)
        for path in (base / META_FILE, base):
            try:
                st = os.stat(path, follow_symlinks=False)
                return (st.st_ino, st.st_mtime_ns)
            except (FileNotFoundError, NotADirectoryError):
                continue
        return None

    # -- reading ---------------------------------------------------------------------------------
    def read(self, name: str) -> StoredVoice:
        """Meta and every feature blob of ``name``; CorruptVoice if anything essential is wrong."""
        base = self.path(name)
        try:
            meta = json.loads((base / META_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CorruptVoice(f"{META_FILE} is missing") from None
        except (OSError, ValueError) as exc:
            raise CorruptVoice(f"{META_FILE} is unreadable: {exc}") from None
        if not isinstance(meta, dict) or any(k not in meta for k in META_KEYS):
            raise CorruptVoice(f"{META_FILE} lacks some of {', '.join(META_KEYS)}")
        if meta["name"] != name:
            raise CorruptVoice(f"{META_FILE} names {meta['name']!r}, not {name!r}")
        if not isinstance(meta["transcript"], str) or not meta["transcript"].strip():
            raise CorruptVoice(f"{META_FILE} has no transcript")
        if not (base / PROMPT_FILE).is_file():
            raise CorruptVoice(f"{PROMPT_FILE} is missing")
        features: dict[str, bytes] = {}
        fdir = base / FEATURES_DIR
        if fdir.is_dir():
            for blob in sorted(fdir.glob("*.bin")):
                if not blob.name.startswith("."):
                    features[blob.stem] = blob.read_bytes()
        return StoredVoice(meta=meta, features=features)

    def read_prompt(self, name: str) -> PromptAudio:
        try:
            return decode_wav((self.path(name) / PROMPT_FILE).read_bytes())
        except (OSError, ValueError, RuntimeError, sf.LibsndfileError) as exc:
            raise CorruptVoice(f"{PROMPT_FILE} is unreadable: {exc}") from None

    # -- writing ---------------------------------------------------------------------------------
    def create(self, meta: dict, original: bytes, ext: str, prompt_wav: bytes, features: dict[str, bytes]) -> Path:
        """Write a complete new voice; FileExistsError if ``meta['name']`` is taken on disk."""
        final = self.path(meta["name"])
        self.ensure()
        tmp = self.root / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            tmp.mkdir()
            (tmp / FEATURES_DIR).mkdir()
            _write_synced(tmp / f"original.{ext}", original)
            _write_synced(tmp / PROMPT_FILE, prompt_wav)
            for family, blob in features.items():
                _write_synced(tmp / FEATURES_DIR / f"{_check_family(family)}.bin", blob)
            _write_synced(tmp / META_FILE, json.dumps(meta, indent=2, ensure_ascii=False).encode())
            fsync_dir(tmp / FEATURES_DIR)
            fsync_dir(tmp)
            if final.exists():
                raise FileExistsError(f"voice directory {final} already exists")
            try:
                # The claim: atomic, and it fails if a (never empty) voice dir of that name
                # appeared meanwhile, from this process or another one on a shared volume.
                os.rename(tmp, final)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    raise FileExistsError(f"voice directory {final} already exists") from None
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(self.root)
        return final

    def write_features(self, name: str, family: str, blob: bytes) -> None:
        fdir = self.path(name) / FEATURES_DIR
        fdir.mkdir(exist_ok=True)
        atomic_write(fdir / f"{_check_family(family)}.bin", blob)

    def delete(self, name: str) -> None:
        """Remove a voice: hide it under a temp name in one rename, then delete the files."""
        src = self.path(name)
        doomed = self.root / f"{DELETED_PREFIX}{uuid.uuid4().hex}"
        os.rename(src, doomed)  # FileNotFoundError if it is not there
        fsync_dir(self.root)
        shutil.rmtree(doomed, ignore_errors=True)
