"""Reference leaks of the C paths: bytes still held after many calls."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable


def bytes_kept(once: Callable[[], None], rounds: int = 500) -> int:
    """Heap growth over ``rounds`` calls of ``once``, after 100 warm-up calls
    (caches, interned strings) and a collection before and after."""
    for _ in range(100):
        once()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(rounds):
        once()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return grown
