"""``WAKELINE_TRACE=1`` prints one line per dispatch, cursor end and job result
(debugging hand-offs between workers)."""

from __future__ import annotations

import os
from typing import Any

TRACE = os.environ.get("WAKELINE_TRACE") == "1"


def trace(*parts: Any) -> None:
    if TRACE:
        print("wakeline-trace", os.getpid(), *parts, flush=True)
