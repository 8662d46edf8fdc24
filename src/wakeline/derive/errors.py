"""Failure taxonomy of derivation runs (seed 003, "retry taxonomy").

    transient  → retried with exponential backoff (2 s, 4 s, 8 s …) up to the budget
    permanent  → not retried; the job is dead at once
    config     → not retried (the catalog or the function is wrong: fix and re-run)
    timeout    → not retried (the run exceeded its derivation's timeout_s)

A derivation raises :class:`TransientError` for "try again later" (a model was
overloaded) and :class:`PermanentError` for "this input can never succeed".
Network-ish builtins (ConnectionError, TimeoutError, OSError) are transient, and
so is any other unexpected exception: a run is never silently dropped, and the
retry budget bounds the cost.
"""

from __future__ import annotations

from wakeline.catalog.errors import FunctionUnresolved, InvalidEmission
from wakeline.errors import WakelineError


class TransientError(WakelineError):
    code = "derive.transient"


class PermanentError(WakelineError):
    code = "derive.permanent"


class RunTimeout(WakelineError):
    code = "derive.timeout"


def classify(exc: BaseException) -> str:
    if isinstance(exc, RunTimeout):
        return "timeout"
    if isinstance(exc, FunctionUnresolved | InvalidEmission | ImportError | AttributeError):
        return "config"
    if isinstance(exc, PermanentError):
        return "permanent"
    return "transient"


def backoff(attempt: int, base: float = 2.0, cap: float = 300.0) -> float:
    """Delay before attempt ``attempt + 1`` (attempt counts from 1)."""
    return min(cap, base * 2 ** (attempt - 1))
