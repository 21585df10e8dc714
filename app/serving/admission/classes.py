"""Traffic classes: ``interactive`` (a live voice waits for it) and ``bulk`` (throughput work that can wait).

A request's class comes from its body's ``priority`` field, an ``X-Priority`` header, or its API key's
default, in that order; without any it is ``interactive``. Interactive requests are admitted as before;
bulk ones wait in their own bounded queue and run only in the capacity interactive work leaves
(``docs/priority.md``).
"""

from __future__ import annotations

from enum import Enum


class Priority(str, Enum):
    INTERACTIVE = "interactive"
    BULK = "bulk"

    def __str__(self) -> str:
        return self.value


NAMES = tuple(p.value for p in Priority)


def parse_priority(value: object) -> Priority:
    """The class a client named (case-insensitive), or ValueError saying which ones exist."""
    if isinstance(value, Priority):
        return value
    if isinstance(value, str):
        try:
            return Priority(value.strip().lower())
        except ValueError:
            pass
    raise ValueError(f"priority must be one of {', '.join(NAMES)}")
