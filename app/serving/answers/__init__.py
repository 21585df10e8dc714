"""The answer cache: a reproducible answer (seeded) stored and sent again without the engine.

* ``key.py``: the key, a hash of everything that determines the bytes (model, voice, text, every
  parameter, seed, format, rate), naming no secret.
* ``memory.py``: the in-memory tier, LRU within a byte budget.
* ``disk.py``: the optional directory tier replicas share, written atomically, checked on read.
* ``cache.py``: :class:`AnswerCache`, both tiers, one computation per key at a time, counters.

The HTTP glue (lookup before a permit, store as the answer is sent) is ``app/api/cached.py``;
the user's guide is docs/cache.md.
"""

from app.serving.answers.cache import AnswerCache, CacheConfig
from app.serving.answers.key import Answer

__all__ = ["Answer", "AnswerCache", "CacheConfig"]
