"""Per-entity condition state: small, serializable, rebuildable from PostgreSQL.

An :class:`EntityState` holds, for one (workspace, entity):

- ``facts``: featurized ready records still needed (pending above some
  watermark, keyed-slot chains, dated rows, rows inside a window);
- ``unready``: unready records of some driving source (they gate watermarks);
- ``ds``: per derivation, the cursor mirror (watermark, last success, handled
  ``at`` deadlines), history counters and the mailbox (queued + running job);
- ``census_base``: event rows folded out of ``facts`` but still counted by a
  census condition;
- ``last_lsn``: where the newest change applied stands, negated (``engine.order_of``:
  its position, then its record's seq), so a redelivered change is skipped; a
  positive value is the bare position an older version stored.

Everything is plain data; :meth:`EntityState.to_dict` / :meth:`from_dict`
round-trip through JSON.  The form the worker stores (its table and changelog) is
the compact one of :mod:`wakeline.core.codec` (``encode_state`` /
``decode_state``), which still reads that JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

try:  # compiled: Cython's decorators (see _nocython)
    import cython
except ImportError:  # run as source without Cython
    from wakeline.core import _nocython as cython

from wakeline.core.plan import Fact


@dataclass(init=False)  # __init__ below: see state.pxd
@cython.no_gc
@cython.cclass
class Job:
    """A queued or running job of one mailbox.

    ``reasons`` maps each monotonic reason key to the earliest instant that
    reason permits the run; the job's ``run_after`` is their minimum.
    """

    __slots__ = ("id", "reasons", "created", "settle", "dedupe", "dispatched")

    id: str
    reasons: dict[str, float]
    created: float
    settle: list[str]
    dedupe: list[str]
    dispatched: float | None

    def __init__(self, id: str, reasons: dict[str, float], created: float,
                 settle: list[str] | None = None, dedupe: list[str] | None = None,
                 dispatched: float | None = None) -> None:
        self.id = id
        self.reasons = reasons
        self.created = created
        self.settle = [] if settle is None else settle
        self.dedupe = [] if dedupe is None else dedupe
        self.dispatched = dispatched

    @property
    def run_after(self) -> float:
        return min(self.reasons.values()) if self.reasons else self.created

    def sorted_reasons(self) -> list[str]:
        return sorted(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "reasons": self.reasons, "created": self.created,
                "settle": self.settle, "dedupe": self.dedupe, "dispatched": self.dispatched}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        return cls(d["id"], dict(d["reasons"]), d["created"], list(d.get("settle", [])),
                   list(d.get("dedupe", [])), d.get("dispatched"))


@dataclass(init=False)  # __init__ below: see state.pxd
@cython.no_gc
@cython.cclass
class DState:
    """One derivation's view of one entity: cursor mirror, counters, mailbox."""

    __slots__ = ("w", "last_success", "handled", "last_run", "total", "queued", "running",
                 "dead", "jobs_made", "cron_last", "waiting_on")

    w: int
    last_success: float | None
    handled: float | None
    last_run: float | None
    total: int
    queued: Job | None
    running: Job | None
    dead: bool
    jobs_made: int
    cron_last: dict[str, float]
    waiting_on: int | None

    def __init__(self, w: int = 0, last_success: float | None = None,
                 handled: float | None = None, last_run: float | None = None, total: int = 0,
                 queued: Job | None = None, running: Job | None = None, dead: bool = False,
                 jobs_made: int = 0, cron_last: dict[str, float] | None = None,
                 waiting_on: int | None = None) -> None:
        self.w = w
        self.last_success = last_success
        self.handled = handled
        self.last_run = last_run
        self.total = total
        self.queued = queued
        self.running = running
        self.dead = dead
        self.jobs_made = jobs_made
        self.cron_last = {} if cron_last is None else cron_last
        self.waiting_on = waiting_on

    def to_dict(self) -> dict[str, Any]:
        return {"w": self.w, "last_success": self.last_success, "handled": self.handled,
                "last_run": self.last_run, "total": self.total,
                "queued": self.queued.to_dict() if self.queued else None,
                "running": self.running.to_dict() if self.running else None,
                "dead": self.dead, "jobs_made": self.jobs_made, "cron_last": self.cron_last,
                "waiting_on": self.waiting_on}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DState:
        return cls(d["w"], d["last_success"], d["handled"], d["last_run"], d["total"],
                   Job.from_dict(d["queued"]) if d.get("queued") else None,
                   Job.from_dict(d["running"]) if d.get("running") else None,
                   d.get("dead", False), d.get("jobs_made", 0), dict(d.get("cron_last", {})),
                   d.get("waiting_on"))


@dataclass(init=False)  # __init__ below: see state.pxd
@cython.no_gc
@cython.cclass
class EntityState:
    __slots__ = ("workspace", "entity", "facts", "unready", "ds", "census_base", "alerted",
                 "last_lsn")

    workspace: str
    entity: str
    facts: dict[int, Fact]
    unready: dict[int, list[Any]]  # seq -> [created, drive]
    ds: dict[str, DState]
    census_base: dict[int, int]
    alerted: list[int]
    last_lsn: int

    def __init__(self, workspace: str, entity: str, facts: dict[int, Fact] | None = None,
                 unready: dict[int, list[Any]] | None = None,
                 ds: dict[str, DState] | None = None,
                 census_base: dict[int, int] | None = None, alerted: list[int] | None = None,
                 last_lsn: int = 0) -> None:
        self.workspace = workspace
        self.entity = entity
        self.facts = {} if facts is None else facts
        self.unready = {} if unready is None else unready
        self.ds = {} if ds is None else ds
        self.census_base = {} if census_base is None else census_base
        self.alerted = [] if alerted is None else alerted
        self.last_lsn = last_lsn

    def d(self, name: str) -> DState:
        st = self.ds.get(name)
        if st is None:
            st = self.ds[name] = DState()
        return st

    def to_dict(self) -> dict[str, Any]:
        return {"workspace": self.workspace, "entity": self.entity,
                "facts": [f.to_list() for f in self.facts.values()],
                "unready": [[s, v[0], list(v[1])] for s, v in self.unready.items()],
                "ds": {k: v.to_dict() for k, v in self.ds.items()},
                "census_base": [[k, v] for k, v in self.census_base.items()],
                "alerted": self.alerted, "last_lsn": self.last_lsn}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EntityState:
        facts = [Fact.from_list(f) for f in d["facts"]]
        return cls(d["workspace"], d["entity"], {f.seq: f for f in facts},
                   {s: [c, tuple(dr)] for s, c, dr in d["unready"]},
                   {k: DState.from_dict(v) for k, v in d["ds"].items()},
                   {int(k): v for k, v in d["census_base"]}, list(d.get("alerted", [])),
                   d.get("last_lsn", 0))
