"""Keep the garbage collector off the objects a service makes once at start-up.

A service's start-up heap (torch, transformers, FastAPI, Faust, the loaded model: ~250,000 objects
for `stacx serve`) is never garbage, yet each full collection walks all of it: ~110 ms a time in
the inference server on the 2-core development machine. Objects that live a little longer than a
request (spans waiting up to a second for their export batch, in-flight episodes) are what pushes
the collector into full collections. `gc.freeze()` moves everything alive at that moment into a
permanent generation that every later collection ignores.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["freeze_startup_heap"]

log = logging.getLogger(__name__)


def freeze_startup_heap(service: str) -> int:
    """Collect once, then freeze what is left (call when `service` is ready to serve, before its
    loop starts); returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("%s: %d start-up objects frozen out of garbage collection", service, frozen)
    return frozen
