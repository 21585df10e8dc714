"""Which rows of the LLM batch step (``batching/bulk.py``): interactive always, bulk oldest first within the room."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import pytest

from app.engines.cosyvoice.llm.bulk import BulkRoom, bulk_left, plan_step


def rows(spec: str) -> list[SimpleNamespace]:
    """``"iBbi"``: i interactive, b/B bulk; a bulk row's age is its place among the bulk rows (B: oldest)."""
    ages = itertools.count(10.0)
    return [SimpleNamespace(name=f"{c}{r}", bulk=c != "i", since=0.0 if c == "B" else next(ages))
            for r, c in enumerate(spec)]


def stepping(batch: list, room: int | None) -> tuple[list[str], list[str]]:
    """(rows that step, the rest) after the planned swaps, by name."""
    m, swaps = plan_step(batch, room)
    batch = list(batch)
    for a, b in swaps:
        batch[a], batch[b] = batch[b], batch[a]
    return [s.name for s in batch[:m]], [s.name for s in batch[m:]]


def test_without_a_limit_or_with_room_for_every_bulk_row_all_step_and_nothing_moves():
    batch = rows("ibib")
    assert plan_step(batch, None) == (4, [])
    assert plan_step(batch, 2) == (4, []) and plan_step(batch, 9) == (4, [])
    assert plan_step(rows("iii"), 0) == (3, [])


def test_interactive_rows_always_step_and_bulk_ones_oldest_first_up_to_the_room():
    batch = rows("bBiib")  # B (row 1) is the oldest bulk row
    front, rest = stepping(batch, 0)
    assert set(front) == {"i2", "i3"} and set(rest) == {"b0", "B1", "b4"}
    front, rest = stepping(batch, 1)
    assert set(front) == {"i2", "i3", "B1"} and set(rest) == {"b0", "b4"}
    front, _ = stepping(batch, 2)
    assert set(front) == {"i2", "i3", "B1", "b0"}


def test_only_bulk_rows_and_no_room_nothing_steps():
    assert plan_step(rows("bb"), 0)[0] == 0


def test_a_steady_choice_needs_no_more_swaps():
    batch = rows("bBiib")
    m, swaps = plan_step(batch, 1)
    for a, b in swaps:
        batch[a], batch[b] = batch[b], batch[a]
    assert plan_step(batch, 1) == (m, [])


@pytest.mark.parametrize("room", [0, 1, 2, 3])
def test_every_swap_moves_a_stepping_row_into_the_front(room):
    batch = rows("bibBbi")
    m, swaps = plan_step(batch, room)
    assert m == 2 + room
    assert all(a < m <= b for a, b in swaps)


def test_bulk_left_counts_the_bulk_rows_against_the_room():
    batch = rows("ibb")
    assert bulk_left(batch, None) == float("inf")
    assert bulk_left(batch, 3) == 1 and bulk_left(batch, 1) == -1


def test_the_room_is_read_safely():
    assert BulkRoom().read() is None
    assert BulkRoom(lambda: -2).read() == 0 and BulkRoom(lambda: 3).read() == 3
    assert BulkRoom(lambda: None).read() is None

    def broken() -> int:
        raise RuntimeError("pool bug")

    room = BulkRoom(broken)
    assert room.read() is None and room.read() is None  # no limit (logged once), never a crashed LLM thread


def test_choosing_the_rows_is_cheap():
    """The per-step choice on a full batch of 32 (16 bulk, room 8): a few microseconds, no growth."""
    batch = rows("ib" * 16)
    t0 = time.perf_counter()
    for _ in range(2000):
        plan_step(batch, 8)
    per_step = (time.perf_counter() - t0) / 2000
    assert per_step < 1e-3  # generous on a shared CPU; measured ~1-7 us
