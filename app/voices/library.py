"""VoiceLibrary: registered voices, computed once through the engine and shared by every slot.

The index (name -> meta + engine-ready features per voice family) lives in memory
behind a lock; the files live in a :class:`~app.voices.store.VoiceStore`. Engine
work (computing, exporting, importing features) runs on a pool slot through
``pool.call``, under the same admission as synthesis, so an overloaded server
refuses a registration exactly as it refuses a synthesis. An imported voice is a
read-only object that every slot uses as is: a new voice works at once, on every
slot, with no restart.

A name is reserved under the lock before its features are computed, so two
registrations of one name cannot both succeed, however they race.

Replicas on one shared voices directory: each process keeps its own index and
follows the directory (:meth:`VoiceLibrary.sync`). A watcher task stats the
root every ``sync_interval_s`` (one ``stat``, nothing read) and, when it
changed, or every ``FULL_SYNC_S`` regardless, reads the listing (name -> token)
and imports the voices that appeared or were replaced (a new meta.json identity), and forgets the ones that
went. Between two processes the store's atomic rename decides a name race
(one 201, one 409). Local commits, deletes and syncs are serialized by one
asyncio lock, so a sync never resurrects a voice this process just deleted.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.engines.base import EngineFailure, InvalidInput, PromptAudio, VoiceCapable
from app.voices.store import (
    META_KEYS,
    CorruptVoice,
    StoredVoice,
    Token,
    VoiceStore,
    decode_wav,
    encode_wav,
    valid_name,
)

log = logging.getLogger("cosyserve.voices")

IMPORT_BATCH = 32  # stored voices imported per pool.call at startup
STALE_TEMP_S = 600.0  # .tmp- leftovers younger than this may be another replica's write in progress
FULL_SYNC_S = 10.0  # re-read the listing this often even if the root's stamp looks unchanged


class VoiceError(Exception):
    """Base class of the library's domain errors (mapped to HTTP in app/api/errors.py)."""


class VoiceNotFound(VoiceError):
    pass


class VoiceExists(VoiceError):
    pass


class VoiceLimitReached(VoiceError):
    pass


class VoiceComputeFailed(VoiceError):
    """The engine could not compute a voice's features (a server-side fault, details logged)."""


class VoiceStorageFull(VoiceError):
    """The voices dir's disk (or quota) is full; the registration was undone, nothing half-written remains."""


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _shown(name: str) -> str:
    """A name from a request (a URL path) for a message: a voice's name is at most 64 characters, so
    anything longer is quoted by its start only, never echoed whole."""
    return repr(name) if len(name) <= 64 else f"{name[:40]!r}... ({len(name)} characters)"


@dataclass
class _Entry:
    meta: dict
    features: dict[str, Any] = field(default_factory=dict)  # voice family -> imported voice
    token: Token | None = None  # store.token() when we read or wrote it


def public_meta(meta: dict) -> dict:
    return {k: meta[k] for k in META_KEYS}


def _capable(engine: Any) -> VoiceCapable:
    if not isinstance(engine, VoiceCapable):
        raise InvalidInput("the loaded model does not support registered voices")
    return engine


def _compute(engine: Any, transcript: str, audio: PromptAudio) -> tuple[Any, bytes]:
    """In a slot thread: the voice's features, and their exported bytes."""
    eng = _capable(engine)
    try:
        voice = eng.compute_voice(transcript, audio)
        return voice, eng.export_voice(voice)
    except InvalidInput:
        raise
    except Exception as exc:
        log.error("computing voice features failed", exc_info=exc)
        raise VoiceComputeFailed("the engine could not compute features for this voice") from exc


def _prepare(audio: PromptAudio, original: bytes) -> tuple[bytes, PromptAudio, str]:
    """In a worker thread: the stored prompt WAV, the audio decoded back from it, the upload's hash."""
    prompt_wav = encode_wav(audio)
    return prompt_wav, decode_wav(prompt_wav), hashlib.sha256(original).hexdigest()


def _import_all(engine: Any, family: str, blobs: list[bytes]) -> list[Any]:
    """In a slot thread: import each blob; a failure is returned in its place, not raised."""
    eng = _capable(engine)
    out: list[Any] = []
    for blob in blobs:
        try:
            voice = eng.import_voice(blob)
            got = getattr(voice, "family", family)
            out.append(voice if got == family else CorruptVoice(f"features are for {got!r}, not {family!r}"))
        except Exception as exc:  # noqa: BLE001 - a bad blob skips one voice, never the server
            out.append(CorruptVoice(f"features do not import: {type(exc).__name__}: {exc}"))
    return out


class VoiceLibrary:
    def __init__(self, root: str | os.PathLike, max_voices: int = 1000, sync_interval_s: float = 0.0) -> None:
        self.store = VoiceStore(root)
        self.max_voices = max_voices
        self.sync_interval_s = sync_interval_s  # 0: do not follow other processes' changes
        self._lock = threading.Lock()
        self._voices: dict[str, _Entry] = {}
        self._pending: set[str] = set()  # names being registered or deleted
        self._broken: dict[str, str] = {}  # directories skipped -> why
        self._broken_tokens: dict[str, Token | None] = {}  # their tokens: not read again until replaced
        self._changes = asyncio.Lock()  # local commits and deletes vs syncs
        self._stamp: tuple | None = None  # store.stamp() at the last sync; None: sync at the next tick
        self._last_sync = 0.0
        self._watcher: asyncio.Task | None = None

    # -- queries (any thread; the event loop never blocks on more than this lock) -----------------
    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._voices)

    def list(self) -> list[dict]:
        with self._lock:
            return [public_meta(self._voices[n].meta) for n in sorted(self._voices)]

    def get(self, name: str) -> dict | None:
        with self._lock:
            entry = self._voices.get(name)
            return public_meta(entry.meta) if entry is not None else None

    def features(self, name: str, voice_family: str) -> Any | None:
        """The engine-ready features of ``name`` for ``voice_family``, or None."""
        with self._lock:
            entry = self._voices.get(name)
            return entry.features.get(voice_family) if entry is not None else None

    def features_and_id(self, name: str, voice_family: str) -> tuple[Any | None, str]:
        """``features(name, voice_family)`` and, read under the same lock, the voice's identity: a hash of
        its stored audio, transcript and registration time (a re-registered voice has another)."""
        with self._lock:
            entry = self._voices.get(name)
            if entry is None:
                return None, ""
            meta = entry.meta
            ident = f"{meta.get('audio_sha256')}|{meta.get('transcript')}|{meta.get('created_at')}"
            return entry.features.get(voice_family), hashlib.sha256(ident.encode()).hexdigest()[:32]

    def broken(self) -> dict[str, str]:
        with self._lock:
            return dict(self._broken)

    # -- startup ---------------------------------------------------------------------------------
    async def start(self, pool: Any) -> None:
        """Load every stored voice for the pool's voice family; skip (and log) the ones that fail."""
        family = pool.info.voice_family
        stamp, listing = await asyncio.to_thread(self._scan)
        stored = await asyncio.to_thread(self._read_all, listing)
        if not family:
            log.warning("voice library: the engine has no voice family; %d stored voice(s) not loaded", len(stored))
            return
        await self._load(pool, family, stored)
        self._stamp, self._last_sync = stamp, time.monotonic()
        log.info("voice library %s: %d voice(s) loaded for %s, %d skipped", self.store.root,
                 len(self._voices), family, len(self._broken))
        if self.sync_interval_s > 0:
            self._watcher = asyncio.create_task(self._watch(pool), name="voice-library-sync")

    async def close(self) -> None:
        """Stop following the directory (the lifespan calls this before draining the pool)."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            try:
                await watcher
            except asyncio.CancelledError:
                pass

    def _sweep(self) -> None:
        """Remove what interrupted writes left (a crash mid-registration) once no writer can own it."""
        for leftover in self.store.clean_temp(min_age_s=STALE_TEMP_S):
            log.warning("voice library: removed %s, left by an interrupted write", leftover)

    def _scan(self) -> tuple[tuple | None, dict[str, Token]]:
        self.store.ensure()
        self._sweep()
        self.store.entries()  # logs what is not a voice directory, once at startup
        stamp = self.store.stamp()  # before the listing: a change during it triggers another sync
        return stamp, self.store.listing()

    def _read_all(self, listing: dict[str, Token]) -> dict[str, tuple[StoredVoice, Token]]:
        stored: dict[str, tuple[StoredVoice, Token]] = {}
        for name, token in sorted(listing.items()):
            try:
                stored[name] = (self.store.read(name), token)
            except FileNotFoundError:
                continue  # deleted (by another process) since the listing
            except (CorruptVoice, OSError) as exc:
                self._skip(name, str(exc), token)
        return stored

    async def _load(self, pool: Any, family: str, stored: dict[str, tuple[StoredVoice, Token]],
                    synced: bool = False) -> None:
        """Import the features of ``stored`` (or compute them from the prompt) and index the voices."""
        ready = [(n, sv, t) for n, (sv, t) in stored.items() if family in sv.features]
        for i in range(0, len(ready), IMPORT_BATCH):
            batch = ready[i:i + IMPORT_BATCH]
            blobs = [sv.features[family] for _, sv, _ in batch]
            results = await pool.call(lambda e, b=blobs: _import_all(e, family, b))
            for (name, sv, token), voice in zip(batch, results):
                if isinstance(voice, Exception):
                    self._skip(name, str(voice), token)
                else:
                    self._add(name, sv.meta, family, voice, token, synced=synced)
        for name, (sv, token) in stored.items():
            if family not in sv.features:
                await self._recompute(pool, name, sv, family, token, synced=synced)

    # -- following other processes on a shared directory -------------------------------------------
    async def _watch(self, pool: Any) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                stamp = await asyncio.to_thread(self.store.stamp)
                if stamp != self._stamp or time.monotonic() - self._last_sync >= FULL_SYNC_S:
                    await self.sync(pool)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. 503 while overloaded or draining: retry next tick
                self._stamp = None
                log.warning("voice library: following %s failed (%s: %s); retrying", self.store.root,
                            type(exc).__name__, exc)

    async def sync(self, pool: Any) -> dict[str, list[str]]:
        """Bring the index in line with the directory: what other processes registered, replaced or deleted.

        Returns the names ``added`` and ``removed``. Pending local changes are left alone.
        """
        family = pool.info.voice_family
        async with self._changes:
            stamp = await asyncio.to_thread(self.store.stamp)
            listing = await asyncio.to_thread(self.store.listing)
            removed, wanted, pending_seen = [], {}, False
            with self._lock:
                for name in list(self._voices) + list(self._broken):
                    if name in self._pending:
                        pending_seen = True
                    elif name not in listing:
                        self._voices.pop(name, None)
                        self._broken.pop(name, None)
                        self._broken_tokens.pop(name, None)
                        removed.append(name)
                for name, token in listing.items():
                    if name in self._pending:
                        pending_seen = True
                        continue
                    entry = self._voices.get(name)
                    if entry is not None and entry.token == token:
                        continue
                    if name in self._broken and self._broken_tokens.get(name) == token:
                        continue
                    wanted[name] = token
            stored = await asyncio.to_thread(self._read_all, wanted) if wanted and family else {}
            if stored:
                await self._load(pool, family, stored, synced=True)
            # a name pending here may be settled by the other process: look again at the next tick
            self._stamp = None if pending_seen else stamp
            self._last_sync = time.monotonic()
        added = sorted(n for n in stored if n in self._voices)
        if added or removed:
            log.info("voice library: synced from %s: %d added or replaced (%s), %d removed (%s)", self.store.root,
                     len(added), ", ".join(added) or "-", len(removed), ", ".join(sorted(removed)) or "-")
        return {"added": added, "removed": sorted(removed)}

    async def _recompute(self, pool: Any, name: str, sv: StoredVoice, family: str, token: Token | None = None,
                         synced: bool = False) -> None:
        """Features for a voice stored without ones for ``family``: compute them from its prompt.wav."""
        try:
            audio = await asyncio.to_thread(self.store.read_prompt, name)
            voice, blob = await pool.call(lambda e: _compute(e, sv.meta["transcript"], audio))
        except (CorruptVoice, VoiceError, InvalidInput, EngineFailure) as exc:
            self._skip(name, f"it has no features for {family} and computing them from its prompt failed: {exc}",
                       token)
            return
        log.info("voice library: computed %s features for voice %r from its stored prompt", family, name)
        self._add(name, sv.meta, family, voice, token, synced=synced)
        try:
            await asyncio.to_thread(self.store.write_features, name, family, blob)
        except OSError as exc:
            log.warning("voice library: could not store the new features of %r (%s); they will be computed "
                        "again at the next start", name, exc)

    def _skip(self, name: str, why: str, token: Token | None = None) -> None:
        log.error("voice library: skipping voice %r in %s: %s", name, self.store.root, why)
        with self._lock:
            self._voices.pop(name, None)
            self._broken[name] = why
            self._broken_tokens[name] = token

    def _add(self, name: str, meta: dict, family: str, voice: Any, token: Token | None = None,
             synced: bool = False) -> None:
        with self._lock:
            if synced and name in self._pending:
                return  # a local registration or delete of this name is under way: it decides
            self._voices[name] = _Entry(meta=meta, features={family: voice}, token=token)
            self._broken.pop(name, None)
            self._broken_tokens.pop(name, None)

    # -- changes ---------------------------------------------------------------------------------
    def _reserve(self, name: str, pool: Any) -> None:
        if not valid_name(name):
            raise InvalidInput(f"invalid voice name {_shown(name)}")
        presets = set(pool.presets)
        with self._lock:
            if name in self._voices or name in self._pending:
                raise VoiceExists(f"a voice named {name!r} already exists; delete it first or pick another name")
            if name in self._broken:
                raise VoiceExists(f"the voices dir holds a voice {name!r} that could not be loaded "
                                  f"({self._broken[name]}); delete it first or pick another name")
            if name in presets:
                raise VoiceExists(f"{name!r} is a preset speaker of the loaded model; pick another name")
            if len(self._voices) + len(self._pending) >= self.max_voices:
                raise VoiceLimitReached(f"the voice library is full ({self.max_voices} voices); "
                                        "delete a voice before registering another")
            self._pending.add(name)

    def _release(self, name: str) -> None:
        with self._lock:
            self._pending.discard(name)

    async def register(self, pool: Any, name: str, transcript: str, description: str | None,
                       audio: PromptAudio, original: bytes, ext: str) -> dict:
        """Compute the voice's features once on a pool slot, store it, and make it usable everywhere."""
        self._reserve(name, pool)
        try:
            family = pool.info.voice_family
            if not family:
                raise InvalidInput("the loaded model does not support registered voices")
            # Off the loop: WAV encoding, decoding and hashing of up to max_upload_mb.
            prompt_wav, audio, digest = await asyncio.to_thread(_prepare, audio, original)
            voice, blob = await pool.call(lambda e: _compute(e, transcript, audio))
        except BaseException:
            self._release(name)
            raise
        meta = {
            "name": name, "transcript": transcript, "description": description or "",
            "created_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "audio_sha256": digest, "sample_rate": audio.sample_rate,
            "duration_s": round(audio.duration_s, 3), "original_file": f"original.{ext}",
        }
        # Shielded: once the features exist, a client that leaves does not undo (or half-do) the commit.
        return await asyncio.shield(self._commit(meta, original, ext, prompt_wav, family, voice, blob))

    async def _commit(self, meta: dict, original: bytes, ext: str, prompt_wav: bytes, family: str,
                      voice: Any, blob: bytes) -> dict:
        name = meta["name"]
        async with self._changes:
            try:
                # leftovers of a crash go at the next registration, not only at the next start
                await asyncio.to_thread(self._sweep)
                await asyncio.to_thread(self.store.create, meta, original, ext, prompt_wav, {family: blob})
                token = await asyncio.to_thread(self.store.token, name)
                self._add(name, meta, family, voice, token)
            except FileExistsError:
                self._stamp = None  # another process won the name: pick its voice up at the next tick
                raise VoiceExists(f"a voice named {name!r} already exists (registered just now through another "
                                  "replica, or a directory of that name is in the voices dir); "
                                  "pick another name") from None
            except OSError as exc:
                if exc.errno not in _FULL:
                    raise
                # store.create removed its temp dir: no part of this voice is on disk or in the index
                log.error("voice library: cannot store voice %r: %s (%s)", name, exc.strerror, self.store.root)
                raise VoiceStorageFull(f"the voice library's disk is full: voice {name!r} was not stored (nothing "
                                       "of it was kept); free space or delete voices, then register it "
                                       "again") from None
            finally:
                self._release(name)
        log.info("voice library: registered voice %r (%.1f s prompt)", name, meta["duration_s"])
        return public_meta(meta)

    async def delete(self, name: str) -> None:
        with self._lock:
            if name in self._pending:
                raise VoiceExists(f"voice {_shown(name)} is being registered or deleted right now; try again")
            entry = self._voices.pop(name, None)
            broken = self._broken.pop(name, None)
            if entry is None and broken is None:
                raise VoiceNotFound(f"no voice named {_shown(name)}")
            self._pending.add(name)
        # Shielded: a client that leaves mid-delete cannot leave the index and the disk disagreeing.
        await asyncio.shield(self._remove(name, entry, broken))

    async def _remove(self, name: str, entry: _Entry | None, broken: str | None) -> None:
        async with self._changes:
            try:
                await asyncio.to_thread(self._delete_files, name)
            except BaseException:
                with self._lock:
                    if entry is not None:
                        self._voices[name] = entry
                    if broken is not None:
                        self._broken[name] = broken
                raise
            finally:
                self._release(name)
        log.info("voice library: deleted voice %r", name)

    def _delete_files(self, name: str) -> None:
        try:
            self.store.delete(name)
        except FileNotFoundError:
            log.warning("voice library: voice %r was already gone from %s", name, self.store.root)

