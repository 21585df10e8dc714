"""Refusals that stay cheap under a retry storm: answered at once up to a rate, then held.

A 503 costs the server about 0.7 ms of CPU with the GIL held (uvicorn's parse,
the envelope, the access line: measured on the 2-core host, docs/concurrency.md).
Clients that honour ``Retry-After`` send few of them. Clients that retry at once
(naive scripts, load tests without backoff) do not: a closed loop of such clients
asks again the moment its 503 arrives, so making a refusal cheaper only makes
them ask faster. Eight of them drew 1,000 503s a second from a server that makes
4 answers a second, took most of a core and the GIL from the engine, and halved
what the server delivered.

The one thing that bounds a closed loop is the time its answer takes. So refusals
are paced (GCRA, a token bucket in virtual time): up to ``rate_per_s`` a second
(bursts of as many) go out at once, as before; beyond that a refusal is held
(an ``asyncio.sleep``: no CPU) until its turn, at most ``MAX_HOLD_S``. A storm of
no-backoff clients then costs ``rate_per_s`` refusals a second, whatever their
number. The pacing is by the server's own refusals, not by client: it needs no
client identity, so it works behind a proxy that puts every client on one
address or one connection, and it never delays an admitted request, only 503s
beyond the rate (which a polite client would not have sent yet).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# The longest a refusal is held: past it (a flood of more than rate x MAX_HOLD_S clients at once)
# a refusal goes out at once, so held coroutines stay bounded (rate x MAX_HOLD_S of them).
MAX_HOLD_S = 5.0


class RefusalPacer:
    """GCRA over refusals: ``hold_s()`` says how long this refusal must wait (0: send it now)."""

    def __init__(self, rate_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s  # 0: no pacing
        self.clock = clock
        self._interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
        self._tolerance = self._interval * max(0.0, rate_per_s - 1)  # a second's worth at once
        self._tat = 0.0  # theoretical arrival time of the next refusal
        self.held = 0  # refusals being held now
        self.held_total = 0  # refusals that were held
        self.held_s_total = 0.0

    def hold_s(self) -> float:
        """Reserve this refusal's turn; the seconds to hold it before it is sent."""
        if self._interval <= 0:
            return 0.0
        now = self.clock()
        tat = max(self._tat, now)
        wait = tat - now - self._tolerance
        if wait > MAX_HOLD_S:
            return 0.0  # a flood beyond what holding can bound: answer now, keep no more coroutines
        self._tat = tat + self._interval
        return max(0.0, wait)

    async def pace(self) -> float:
        """Hold this refusal until its turn (no CPU while held); the seconds it was held."""
        wait = self.hold_s()
        if wait <= 0:
            return 0.0
        self.held += 1
        self.held_total += 1
        self.held_s_total += wait
        try:
            await asyncio.sleep(wait)
        finally:
            self.held -= 1
        return wait
