"""The events the condition core consumes.  All instants are epoch seconds (UTC)."""

from __future__ import annotations

from dataclasses import dataclass

try:  # compiled: Cython's decorators (see _nocython)
    import cython
except ImportError:  # run as source without Cython
    from wakeline.core import _nocython as cython

from wakeline.core.plan import Rec


@dataclass(init=False)  # not frozen: one per change; __init__ below: see events.pxd
@cython.no_gc
@cython.cclass
class RecordChanged:
    """A change of a ``records`` row: insert (c), update (u), delete (d), snapshot (r).

    ``after`` is None for a delete; ``before`` is the old row where known.  An
    unready row is tracked only for the readiness gate; it is never visible to a
    condition until an update makes it ready.  ``lsn`` (the change's position)
    and then its record's seq order an entity's changes (``engine.order_of``: the
    rows of one ``COPY`` share an LSN); a change at or below the last one applied is a
    redelivery.
    """

    __slots__ = ("op", "after", "before", "lsn")

    op: str
    after: Rec | None
    before: Rec | None
    lsn: int

    def __init__(self, op: str, after: Rec | None, before: Rec | None = None,
                 lsn: int = 0) -> None:
        self.op = op
        self.after = after
        self.before = before
        self.lsn = lsn


@dataclass(frozen=True)
class CursorAdvanced:
    """A run of ``derivation`` for this entity ended (co-committed with the cursor).

    ``outcome`` is succeeded | noop | failed | dead.
    """

    derivation: str
    watermark: int
    finished_at: float
    outcome: str
    job_id: str | None = None
    lsn: int = 0


@dataclass(frozen=True)
class Tick:
    """Time passed; due jobs may dispatch."""


@dataclass(frozen=True)
class ManualRun:
    derivation: str
    run_after: float | None = None


@dataclass(frozen=True)
class Read:
    max_staleness: float | None = None


@dataclass(frozen=True)
class CronFire:
    """A cron bucket reached this entity.  ``catchup``: earlier buckets fired with it
    after downtime (bounded), which coalesce into the same job."""

    trigger: str
    bucket: float
    catchup: tuple[float, ...] = ()


@dataclass(frozen=True)
class SlotRestored:
    """The answer to a :attr:`Step.reload` request: ``record`` is the slot's latest
    ready ``active`` row with ``seq < below`` as PostgreSQL holds it now (None when
    there is none).  After an erasure deletes a slot's head, that row is the head
    again ("erasure restores prior heads without writing new rows"), but the core
    may have forgotten it once every cursor consumed it."""

    collection: str
    key: str
    below: int
    record: Rec | None = None


@dataclass(frozen=True)
class Reevaluate:
    """Evaluate every trigger again (after a resume or a catalog change)."""

    derivation: str | None = None


Event = (RecordChanged | CursorAdvanced | Tick | ManualRun | Read | CronFire | Reevaluate
         | SlotRestored)
