"""``SessionRegistry``: one registry for every streaming surface, each counted against its own limit, one drain."""

from __future__ import annotations

import asyncio

import pytest

from app.serving.session import SessionRegistry, TooManySessions


class Handle:
    def __init__(self, registry: SessionRegistry, busy: bool = False) -> None:
        self.registry, self.busy = registry, busy
        self.drained = self.forced = False

    async def drain(self) -> None:
        self.drained = True
        if not self.busy:
            self.registry.discard(self)

    async def force_close(self) -> None:
        self.forced = True
        self.registry.discard(self)


def test_each_surface_is_counted_against_its_own_limit():
    reg = SessionRegistry()
    ws = [Handle(reg) for _ in range(2)]
    for h in ws:
        reg.add(h, 2)
    wy = Handle(reg)
    reg.add(wy, 1, "wyoming")  # two WebSocket sessions do not fill the Wyoming limit
    with pytest.raises(TooManySessions, match=r"Wyoming connections .*wyoming\.max_sessions"):
        reg.add(Handle(reg), 1, "wyoming")
    with pytest.raises(TooManySessions, match=r"WebSocket sessions .*websocket\.max_sessions"):
        reg.add(Handle(reg), 2)
    reg.add(wy, 1, "wyoming")  # counted once
    assert (len(reg), reg.count("websocket"), reg.count("wyoming")) == (3, 2, 1)
    reg.discard(wy)
    reg.add(Handle(reg), 1, "wyoming")
    assert reg.count("wyoming") == 1


def test_one_drain_ends_every_surface():
    async def go():
        reg = SessionRegistry()
        idle, busy = Handle(reg), Handle(reg, busy=True)
        reg.add(idle, 5)
        reg.add(busy, 5, "wyoming")
        forced = await reg.drain(0.05)
        return reg, idle, busy, forced

    reg, idle, busy, forced = asyncio.run(go())
    assert idle.drained and busy.drained and busy.forced and not idle.forced
    assert forced == 1 and len(reg) == 0
