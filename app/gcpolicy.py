"""The garbage collector around the loaded model.

Loading a model creates hundreds of thousands of long-lived Python objects (modules,
parameters, their dicts); every full (generation 2) collection walks all of them again, and
it holds the GIL while it does: the event loop stops answering (a 503 that should take 2 ms
waits for it) and the synthesis threads stop too. Measured on tiny v2, one full collection of
a loaded server's heap: see docs/concurrency.md ("The garbage collector and the loaded model").

* ``paused()``: no automatic collection while the engines load (they allocate in bulk and free
  almost nothing: the passes find nothing to collect);
* ``freeze_loaded()``: once loaded, one collection, then ``gc.freeze()``: what survived moves
  to the permanent generation, which later collections skip (the CPython docs' advice for a
  process that has finished its start-up);
* ``thaw()``: at shutdown, so a process that builds the app again (tests) does not pile up
  frozen objects of apps that are gone.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Automatic collection off inside; restored as it was, whatever happens."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def freeze_loaded() -> int:
    """Collect once, then freeze what survived; returns the number of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw() -> None:
    gc.unfreeze()
