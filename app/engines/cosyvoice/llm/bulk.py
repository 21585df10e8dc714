"""Which rows of the running LLM batch take the next step: every interactive row, bulk rows in the room left.

The pool hands the engine ``room()``: how many bulk requests may compute now (the admission
limit less the interactive load; ``engine.set_bulk_room``). Each decode step then takes every
interactive row (the batch holds at most ``max_batch_size``, so all of them fit), then bulk
rows, oldest request first, up to ``room()``. A bulk row left out of a step keeps its cache
row, tokens and sampler, and simply joins a later step: bulk yields at the grain of one
decode step, and a step never waits for a bulk row.

The rows that step are kept at the front of the cache (``BatchedKV`` rows ``0..m-1``), so a
step still reads plain views; :func:`plan_step` says which rows to exchange for that. When the
chosen set is every row (no room function, or room for every bulk row: the usual case) it is
one pass over the rows and nothing moves; rows move only when the chosen set changes.

Starvation: a started bulk request steps whenever ``room() > 0`` and it is among the
``room()`` oldest bulk rows; the oldest always is, so bulk requests finish one after another.
While ``room()`` stays 0 bulk rows wait (their cache kept) and new bulk sequences are not
prefilled; the pool's own timeouts (the request deadline, the client leaving) end them, and a
cancelled waiting row is dropped within ``POLL_BULK_S``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("cosyserve.engine.batch")

POLL_BULK_S = 0.02  # while only bulk work waits for room: how often to read the room again
Room = Callable[[], "int | None"]


class BulkRoom:
    """The pool's ``room()`` read safely: None (no limit) when unset, or when it fails (logged once)."""

    def __init__(self, fn: Room | None = None) -> None:
        self.fn = fn
        self._failed = False

    def read(self) -> int | None:
        fn = self.fn
        if fn is None:
            return None
        try:
            room = fn()
        except Exception:
            if not self._failed:
                self._failed = True
                log.exception("engine bulk room function failed; bulk rows are not limited")
            return None
        return None if room is None else max(0, int(room))


def bulk_left(rows: Sequence[Any], room: int | None) -> float:
    """How many more bulk rows may join and still step (inf without a limit)."""
    if room is None:
        return float("inf")
    return room - sum(1 for s in rows if s.bulk)


def plan_step(rows: Sequence[Any], room: int | None) -> tuple[int, list[tuple[int, int]]]:
    """``(m, swaps)``: after exchanging each pair of rows in ``swaps``, rows ``0..m-1`` take the step.

    ``rows[r]`` is the sequence in cache row r (``.bulk``, ``.since``: its request's start).
    """
    n = len(rows)
    bulk = [r for r in range(n) if rows[r].bulk]
    if room is None or room >= len(bulk):
        return n, []
    keep = set(sorted(bulk, key=lambda r: rows[r].since)[:max(0, room)])
    m = n - len(bulk) + len(keep)
    holes = [r for r in range(m) if rows[r].bulk and r not in keep]  # left out, inside the front
    outside = [r for r in range(m, n) if not rows[r].bulk or r in keep]  # stepping, behind the front
    return m, list(zip(holes, outside))
