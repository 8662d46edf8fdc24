"""Rebuild an entity's condition state from PostgreSQL rows alone (invariant 1).

Given the entity's ``records`` rows and its ``derivation_cursors`` rows, the
state is the same as the one built by streaming every change in order: the
core's state is a function of the rows, not of the arrival order.  Used after
topic loss, retention expiry or a memory-only broker restart; queued jobs are
re-derived by re-evaluating every trigger.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from wakeline.core.engine import Engine, Step
from wakeline.core.events import RecordChanged, Reevaluate
from wakeline.core.plan import Rec
from wakeline.core.state import EntityState


@dataclass(frozen=True)
class CursorRow:
    derivation: str
    watermark: int
    last_success_at: float | None = None
    last_run_at: float | None = None
    at_handled_through: float | None = None


def rebuild(engine: Engine, workspace: str, entity: str, records: Iterable[Rec],
            cursors: Iterable[CursorRow], now: float) -> Step:
    st = EntityState(workspace, entity)
    for c in cursors:
        if c.derivation not in engine.plan.derivations:
            continue
        ds = st.d(c.derivation)
        ds.w = c.watermark
        ds.last_success = c.last_success_at
        ds.last_run = c.last_run_at
        ds.handled = c.at_handled_through
    outcomes = []
    for rec in sorted(records, key=lambda r: r.seq):
        step = engine.apply(st, RecordChanged("r", rec), now)
        st = step.state
        outcomes.extend(step.outcomes)
    engine._prune(st, now=now)  # noqa: SLF001 - the rebuild owns this state
    step = engine.apply(st, Reevaluate(), now)
    step.outcomes[:0] = outcomes
    return step
