"""API keys: a key's shape, and the keys file (one key a line, each with its default traffic class)."""

from __future__ import annotations

from pathlib import Path

from app.serving.admission.classes import parse_priority


def check_key(key: str) -> None:
    # Never echo a key in an error: the message goes to logs and terminals.
    if not key or len(key) > 512 or not all(33 <= ord(c) < 127 for c in key):
        raise ValueError("an API key must be 1-512 printable ASCII characters without spaces")


def read_keys_file(path: str) -> dict[str, str | None]:
    """The keys in ``path`` and each one's default traffic class: ``KEY`` or ``KEY priority=bulk`` a line,
    blank lines and '#' comments skipped; at least one."""
    try:
        lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read api_keys_file {path!r}: {getattr(exc, 'strerror', None) or exc}") from None
    keys: dict[str, str | None] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.strip().startswith("#"):
            continue
        key, *options = line.split()
        check_key(key)
        keys[key] = _key_priority(options, f"api_keys_file {path!r} line {number}")
    if not keys:
        raise ValueError(f"api_keys_file {path!r} holds no key (one a line)")
    return keys


def _key_priority(options: list[str], where: str) -> str | None:
    """A key line's options (only ``priority=CLASS``); the message names the line, never the key."""
    priority = None
    for option in options:
        name, _, value = option.partition("=")
        if name != "priority":
            raise ValueError(f"{where}: unknown option {name[:40]!r}; a line is KEY or KEY priority=bulk")
        try:
            priority = parse_priority(value).value
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return priority


