"""The knee search: how many requests running at once pay, within the budget.

Over budget, Little's law says how far down. Within it the limit settles on the knee, the fewest
running that score within ``MIN_GAIN`` of the best level seen, a level's score being its
throughput discounted for the latency it adds, X(n) / n ** ``latency_weight``. It grows past
the known levels by the headroom while far under budget, else one at a time (a probe), and
probes n - 1 when that is unknown or stale. The rationale: docs/design/limiter.md.
"""

from __future__ import annotations

from app.serving.admission.limit.baseline import DEADBAND
from app.serving.admission.limit.levels import Levels

MIN_GAIN = 0.03  # one more running must score this much more than the fewer (and twice that to step back up)
FAST_RATIO = 2.0  # latency under target / this: grow by the headroom, else probe one more
MAX_DOWN = 0.5  # a step at most halves the limit ...
MAX_UP = 1.5  # ... and at most multiplies it by 1.5


class KneeSearch:
    def __init__(self, levels: Levels, latency_weight: float = 0.125) -> None:
        self.levels = levels
        self.latency_weight = latency_weight

    def score(self, level: int, x: float) -> float:
        """Throughput ``x`` discounted for the latency it adds: one more running must buy about
        ``latency_weight`` / n more throughput (6 % at 2, under 1 % at 16)."""
        return x / level ** self.latency_weight

    def decide(self, old: float, n: int, ratio: float, crowded: bool, target: float) -> float:
        """The next limit from ``old`` (value ``n``), whose fresh median latency is ``target / ratio``;
        ``crowded``: its places were kept busy and more was offered than they hold."""
        scores = {k: None if x is None else self.score(k, x) for k, x in self.levels.paired(n).items()}
        here, below, above = (scores.get(k) for k in (n, n - 1, n + 1))
        known = [x for x in scores.values() if x is not None]
        enough = (1.0 - MIN_GAIN) * max(known) if known else None  # within MIN_GAIN of the best seen
        if ratio < 1.0 - DEADBAND:
            return old * max(ratio, MAX_DOWN)  # over budget: Little's law says how far down
        if here is not None and below is not None and enough is not None and below >= enough:
            return n - 0.5  # one fewer scores about as well as the best: the knee is below
        if ratio > 1.0 + DEADBAND and crowded:
            if above is not None:  # known: one more, if n is short of the knee and n + 1 scored more
                short = here is not None and enough is not None and here < enough
                gains = here is not None and above > here * (1.0 + 2 * MIN_GAIN)  # a hysteresis
                if short and gains and not self.levels.missed(n + 1, target):
                    return n + 1.0
            elif ratio >= FAST_RATIO or here is not None:  # unknown: by the headroom, or one more once n is known
                new = max(old * min(ratio, MAX_UP), n + 1.0) if ratio >= FAST_RATIO else n + 1.0
                missed = [k for k in self.levels if k > n and self.levels.missed(k, target)]
                if missed:
                    new = min(new, min(missed) - 1e-6)  # never grow back onto a level that missed the budget
                if new >= n + 1.0:
                    return new
        if here is not None and below is None and n > 1:
            return n - 0.5  # at the budget or the knee with the level below unknown (or stale): probe it
        return old
