"""The memory tier: answers by key, least recently used first out, within a byte budget."""

from __future__ import annotations

from collections import OrderedDict

from app.serving.answers.key import Answer


class MemoryTier:
    """An LRU of answers whose sizes (``Answer.size``) never add up past ``budget`` bytes. Loop-only."""

    def __init__(self, budget: int) -> None:
        self.budget = max(0, int(budget))
        self.bytes = 0
        self.evictions = 0
        self._items: OrderedDict[str, Answer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> Answer | None:
        answer = self._items.get(key)
        if answer is not None:
            self._items.move_to_end(key)
        return answer

    def put(self, key: str, answer: Answer) -> bool:
        """Store ``answer`` (replacing the key's old one), evicting the least recently used as needed;
        False (nothing changed but the old entry removed) when it alone is larger than the budget."""
        self.discard(key)
        if answer.size > self.budget:
            return False
        while self.bytes + answer.size > self.budget:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.size
            self.evictions += 1
        self._items[key] = answer
        self.bytes += answer.size
        return True

    def discard(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.size
