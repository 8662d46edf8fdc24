"""Typed outcomes: every non-fire is recorded with a kind, a reason and detail.

Kinds are a closed set (``OutcomeKind``); the reason is a human sentence and the
detail a JSON-able map (value and threshold, until, seq, bucket, …).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

try:  # compiled: Cython's decorators (see _nocython)
    import cython
except ImportError:  # run as source without Cython
    from wakeline.core import _nocython as cython

from wakeline.clock import iso


class OutcomeKind(StrEnum):
    BELOW_THRESHOLD = "below_threshold"
    NO_PENDING = "no_pending"
    NOT_SETTLED = "not_settled"
    COOLDOWN = "cooldown"
    DEBOUNCE = "debounce"
    PENDING_UNREADY = "pending_unready"
    UNREADY_STALLED = "unready_stalled"
    WAITING_RUNNING = "waiting_running"
    AT_SCHEDULED = "at_scheduled"
    CENSUS_BELOW = "census_below"
    LIFECYCLE_NOT_MET = "lifecycle_not_met"
    NO_TRANSITION = "no_transition"
    NO_MATCH = "no_match"
    CRON_CLEAN = "cron_clean"
    MISSED_CRON = "missed_cron"
    DUPLICATE_CRON = "duplicate_cron"
    PAUSED = "paused"
    ENRICHMENT_FAILED = "enrichment_failed"
    DEAD_LETTER = "dead_letter"
    NOOP = "noop"
    FAILED = "failed"
    DEAD = "dead"
    OUTCOMES_DROPPED = "outcomes_dropped"


@dataclass(init=False)  # __init__ below: see outcomes.pxd
@cython.no_gc
@cython.cclass
class Outcome:
    __slots__ = ("kind", "reason", "at", "workspace", "entity", "derivation", "trigger",
                 "detail")

    kind: OutcomeKind
    reason: str
    at: datetime
    workspace: str
    entity: str
    derivation: str | None
    trigger: str | None
    detail: dict[str, Any]

    def __init__(self, kind: OutcomeKind, reason: str, at: datetime, workspace: str = "",
                 entity: str = "", derivation: str | None = None, trigger: str | None = None,
                 detail: dict[str, Any] | None = None) -> None:
        self.kind = kind
        self.reason = reason
        self.at = at
        self.workspace = workspace
        self.entity = entity
        self.derivation = derivation
        self.trigger = trigger
        self.detail = {} if detail is None else detail

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "reason": self.reason,
            "at": iso(self.at),
            "workspace": self.workspace,
            "entity": self.entity,
            "derivation": self.derivation,
            "trigger": self.trigger,
            "detail": self.detail,
        }
