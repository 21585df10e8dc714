"""The directory tier: answers as files that replicas may share (the voices volume pattern).

One answer is one file, ``<root>/<key[:2]>/<key>.answer``: a magic line, a JSON header line
(the key, media type, rate, audio seconds, chunk sizes, the payload's sha256) and the payload.
It is written whole to a ``.tmp-`` file in the same directory, fsynced and renamed, so a reader
sees the whole answer or none; a file that is short, foreign, for another key or whose payload
does not hash to its header is a miss (and removed), never a wrong answer.

The tier keeps its files under ``budget`` bytes as this process sees them: before a write that
would pass it, the directory is scanned and the least recently used files (by mtime, which a read
refreshes) are removed until the new answer fits with a tenth of the budget to spare. Replicas
sharing the directory each enforce it at their writes. Every method blocks (file I/O): call it in
a thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

from app.serving.answers.key import Answer
from app.voices.store import TEMP_PREFIX, atomic_write

log = logging.getLogger("cosyserve.cache")

MAGIC = b"cosyserve-answer 1\n"
SUFFIX = ".answer"
STALE_TEMP_S = 600.0  # .tmp- files younger than this may be another replica's write in progress
HEADER_MAX = 1 << 16


def _encode(key: str, answer: Answer) -> bytes:
    payload = answer.data
    header = {"key": key, "media_type": answer.media_type, "sample_rate": answer.sample_rate,
              "audio_s": answer.audio_s, "chunks": [len(c) for c in answer.chunks],
              "sha256": hashlib.sha256(payload).hexdigest()}
    return MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload


def _decode(key: str, raw: bytes) -> Answer | None:
    if not raw.startswith(MAGIC):
        return None
    end = raw.find(b"\n", len(MAGIC), len(MAGIC) + HEADER_MAX)
    if end < 0:
        return None
    try:
        header = json.loads(raw[len(MAGIC):end])
        sizes = [int(n) for n in header["chunks"]]
        payload = raw[end + 1:]
        if (header["key"] != key or sum(sizes) != len(payload) or min(sizes, default=0) < 0
                or hashlib.sha256(payload).hexdigest() != header["sha256"]):
            return None
        chunks, at = [], 0
        for n in sizes:
            chunks.append(payload[at:at + n])
            at += n
        return Answer(str(header["media_type"]), int(header["sample_rate"]), float(header["audio_s"]), tuple(chunks))
    except (ValueError, KeyError, TypeError):
        return None


class DiskTier:
    def __init__(self, root: str | os.PathLike, budget: int) -> None:
        self.root = Path(root)
        self.budget = int(budget)
        self.evictions = 0
        self.corrupt = 0
        self._lock = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True)
        self.bytes = self._scan_and_clean()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}{SUFFIX}"

    def _files(self) -> list[tuple[float, int, Path]]:
        found = []
        for sub in self.root.iterdir():
            if not sub.is_dir() or sub.name.startswith("."):
                continue
            for f in sub.iterdir():
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue  # another replica removed it
                if f.name.startswith(TEMP_PREFIX):
                    if time.time() - st.st_mtime > STALE_TEMP_S:
                        f.unlink(missing_ok=True)
                elif f.name.endswith(SUFFIX):
                    found.append((st.st_mtime, st.st_size, f))
        return found

    def _scan_and_clean(self) -> int:
        return sum(size for _, size, _ in self._files())

    def get(self, key: str) -> Answer | None:
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            log.warning("answer cache: cannot read %s: %s", path.name, exc)
            return None
        answer = _decode(key, raw)
        if answer is None:
            self.corrupt += 1
            log.warning("answer cache: %s is damaged or foreign: removed, answered as a miss", path.name)
            path.unlink(missing_ok=True)
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return answer

    def put(self, key: str, answer: Answer) -> bool:
        """Write ``answer`` atomically, evicting old files first if it would pass the budget;
        False when it alone is larger than the budget or the write failed (logged; nothing half-written)."""
        data = _encode(key, answer)
        if len(data) > self.budget:
            return False
        path = self.path(key)
        with self._lock:
            if self.bytes + len(data) > self.budget:
                self._evict(self.budget - len(data) - self.budget // 10)
            try:
                path.parent.mkdir(exist_ok=True)
                old = path.stat().st_size if path.exists() else 0
                atomic_write(path, data)
            except OSError as exc:
                log.warning("answer cache: cannot write %s: %s", path.name, exc)
                return False
            self.bytes += len(data) - old
        return True

    def _evict(self, target: int) -> None:
        """Remove the least recently used files until the directory holds at most ``target`` bytes."""
        files = sorted(self._files())
        total = sum(size for _, size, _ in files)
        for _, size, f in files:
            if total <= max(0, target):
                break
            f.unlink(missing_ok=True)
            total -= size
            self.evictions += 1
        self.bytes = total
