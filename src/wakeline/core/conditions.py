# cython: annotation_typing=True
"""Each condition kind as a pure fold over an entity's facts.

``evaluate(plan, st, cond, now)`` answers: does the condition hold for this
entity now, with what value, and from when does it permit a run?  No I/O, no
clock: ``now`` is an argument.  Definitions: docs/semantics.md.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

try:  # compiled: Cython's decorators (see _nocython)
    import cython
except ImportError:  # run as source without Cython
    from wakeline.core import _nocython as cython

from wakeline.clock import iso
from wakeline.core.outcomes import OutcomeKind
from wakeline.core.plan import CondPlan, DerivationPlan, Fact, Plan, in_scope
from wakeline.core.state import DState, EntityState


@dataclass(init=False)  # __init__ below: see conditions.pxd
@cython.no_gc
@cython.cclass
class Eval:
    __slots__ = ("cond", "holds", "permitted", "settle", "kind", "reason", "value",
                 "detail", "stimulus")

    cond: CondPlan
    holds: bool
    permitted: float | None
    settle: bool
    kind: OutcomeKind | None
    reason: str
    value: Any
    detail: dict[str, Any]
    #: A stimulus for the mailbox even though the condition does not hold yet
    #: (quiet before it settles: the job waits for the settle instant).
    stimulus: bool

    def __init__(self, cond: CondPlan, holds: Any, permitted: Any = None, settle: Any = False,
                 kind: OutcomeKind | None = None, reason: str = "", value: Any = None,
                 detail: dict[str, Any] | None = None, stimulus: Any = False) -> None:
        # (`Any`: compiled with annotation typing, a `bool` or `float` here would convert)
        self.cond = cond
        self.holds = holds
        self.permitted = permitted
        self.settle = settle
        self.kind = kind
        self.reason = reason
        self.value = value
        self.detail = {} if detail is None else detail
        self.stimulus = stimulus


def _ts(t: float | None) -> str | None:
    from datetime import UTC, datetime

    return None if t is None else iso(datetime.fromtimestamp(t, UTC))


_SEQ = attrgetter("seq")


def ready_facts(st: EntityState) -> list[Fact]:
    """The entity's ready facts by seq (what :func:`pending` filters), for a caller
    that evaluates several derivations on the same facts."""
    f: Fact  # noqa: F842 - compiled, this types the comprehensions' f (conditions.pxd)
    out = [f for f in st.facts.values() if f.ready]
    out.sort(key=_SEQ)
    return out


def pending(st: EntityState, d: DerivationPlan, ready: list[Fact] | None = None) -> list[Fact]:
    """Ready driving-source records above the derivation's watermark, by seq.
    ``ready``: :func:`ready_facts` of the same state, when the caller has it."""
    ds: DState | None = st.ds.get(d.name)
    w = ds.w if ds is not None else 0
    i = d.index
    f: Fact  # noqa: F842 - compiled, this types the comprehensions' f (conditions.pxd)
    if ready is not None:
        return [f for f in ready if i in f.drive and f.seq > w]
    out = [f for f in st.facts.values() if f.ready and i in f.drive and f.seq > w]
    out.sort(key=_SEQ)
    return out


def lowest_unready(st: EntityState, d: DerivationPlan) -> int | None:
    w = st.ds[d.name].w if d.name in st.ds else 0
    seqs = [s for s, (_, drive) in st.unready.items() if d.index in drive and s > w]
    return min(seqs) if seqs else None


def gate(st: EntityState, d: DerivationPlan) -> int | None:
    """The unready seq a job of ``d`` must wait on, if the oldest pending input is unready."""
    u = lowest_unready(st, d)
    if u is None:
        return None
    ready = pending(st, d)
    if ready and ready[0].seq < u:
        return None
    return u


def chains(st: EntityState, collections: Iterable[str]) -> defaultdict[tuple[str, str], list[Fact]]:
    """Slot chains (ready, active rows of keyed collections), each sorted by seq."""
    wanted = set(collections)
    out: defaultdict[tuple[str, str], list[Fact]] = defaultdict(list)
    if not wanted:
        return out
    f: Fact  # compiled, this types the loop's f (conditions.pxd)
    for f in st.facts.values():
        if f.key is not None and f.ready and f.active and f.coll in wanted:
            out[(f.coll, f.key)].append(f)
    for chain in out.values():
        chain.sort(key=_SEQ)
    return out


def current(st: EntityState, plan: Plan, cond: CondPlan) -> list[Fact]:
    """Current records in a condition's scope: slot heads, and every event row."""
    assert cond.scope is not None
    names, cid = cond.scope.names, cond.cid
    keyed = plan.keyed_names_of_cid[cid]
    f: Fact  # noqa: F842 - compiled, this types the comprehensions' f (conditions.pxd)
    rows = [f for f in st.facts.values() if f.key is None and f.ready and not f.tomb
            and f.coll in names and cid in f.cond]
    if not keyed:
        return rows
    heads = [chain[-1] for chain in chains(st, keyed).values()]
    return [f for f in heads if not f.tomb and cid in f.cond] + rows


def window_start(cond: CondPlan, now: float) -> float:
    assert cond.window is not None
    size, hop = cond.window
    return (math.floor((now - size) / hop) + 1) * hop


def aggregate(name: str, values: list[Any], metric_kind: str) -> float | None:
    if metric_kind == "count" and name in ("sum", "count"):
        return float(len(values))
    present = [v for v in values if v is not None]
    if name == "sum":
        return float(sum(present))
    if name == "count":
        return float(len(present))
    if name == "distinct_count":
        return float(len(set(present)))
    if not present:
        return None
    if name == "avg":
        return float(sum(present) / len(present))
    if name == "max":
        return float(max(present))
    if name == "min":
        return float(min(present))
    raise ValueError(name)


def transition(prev: Fact | None, rec: Fact) -> str | None:
    if rec.tomb:
        return "removed" if prev is not None and not prev.tomb else None
    if prev is None or prev.tomb:
        return "added"
    return "changed" if prev.digest != rec.digest else None


def evaluate(plan: Plan, st: EntityState, cond: CondPlan, now: float,
             fresh: list[Fact] | None = None) -> Eval:
    """``fresh``: ``pending(st, d)`` of the condition's derivation when the caller
    has it (it evaluates several conditions of one derivation on the same state)."""
    d = plan.derivations[cond.derivation]
    if cond.kind in PENDING_KINDS and fresh is None:
        fresh = pending(st, d)
    return KINDS[cond.kind](plan, st, d, st.ds.get(d.name) or DState(), cond, now, fresh)


def _write(plan: Plan, st: EntityState, d: DerivationPlan, ds: DState, c: CondPlan,
           now: float, fresh: Any) -> Eval:
    f: Fact  # noqa: F842 - compiled, this types the comprehensions' f (conditions.pxd)
    hits = [f for f in fresh if c.cid in f.cond]
    if not hits:
        return Eval(c, False, kind=OutcomeKind.NO_PENDING, value=0,
                    reason=f"no matching record above watermark {ds.w}")
    return Eval(c, True, permitted=min(_arrived(f) for f in hits), value=len(hits),
                reason=f"{len(hits)} matching record(s) above watermark {ds.w}",
                detail={"seqs": [f.seq for f in hits[:20]]})


def _arrived(f: Fact) -> float:
    return f.arrived if f.arrived is not None else f.created


def _changed(plan: Plan, st: EntityState, d: DerivationPlan, ds: DState, c: CondPlan,
             now: float, fresh: Any) -> Eval:
    assert c.scope is not None
    names = c.scope.names
    transitions = c.transitions if c.kind == "changed" else frozenset({"removed"})
    found: list[tuple[int, str, str]] = []
    considered = 0
    for (_coll, key), chain in chains(st, names).items():
        if c.keys is not None and key not in c.keys:
            continue
        prev: Fact | None = None
        for f in chain:
            if f.seq > ds.w and d.index in f.drive and in_scope(f, c.cid):
                considered += 1
                kind = transition(prev, f)
                ok_where = not f.tomb or (prev is not None and c.cid in prev.cond)
                if kind in transitions and ok_where:
                    found.append((f.seq, key, kind))
            prev = f
    if not found:
        why = ("pending keyed records do not change any head"
               if considered else f"no keyed record in scope above watermark {ds.w}")
        kind = OutcomeKind.NO_TRANSITION if considered else OutcomeKind.NO_PENDING
        return Eval(c, False, kind=kind, reason=why, value=0)
    found.sort()
    first = st.facts[found[0][0]]
    return Eval(c, True, permitted=_arrived(first), value=len(found),
                reason=f"{found[0][1]} {found[0][2]} at seq {found[0][0]}",
                detail={"transitions": [{"seq": s, "key": k, "transition": t}
                                        for s, k, t in found[:20]]})


def _accumulator(plan: Plan, st: EntityState, d: DerivationPlan, ds: DState, c: CondPlan,
                 now: float, fresh: Any) -> Eval:
    assert c.metric is not None
    f: Fact  # noqa: F842 - compiled, this types the comprehensions' f (conditions.pxd)
    rows = [f for f in fresh if c.cid in f.cond]
    if c.window is not None:
        start = window_start(c, now)
        rows = [f for f in rows if start <= f.created <= now]
    if not rows:
        return Eval(c, False, kind=OutcomeKind.NO_PENDING,
                    reason=f"no pending record above watermark {ds.w}", value=None)
    value = aggregate(c.metric.aggregate, [f.cond[c.cid] for f in rows], c.metric.kind)
    detail = {"value": value, "threshold": c.threshold, "comparison": c.comparison,
              "records": len(rows)}
    if value is None:
        return Eval(c, False, kind=OutcomeKind.BELOW_THRESHOLD, value=None, detail=detail,
                    reason="every pending value is missing")
    ok = value >= c.threshold if c.comparison == "gte" else value <= c.threshold
    if not ok:
        rel = "<" if c.comparison == "gte" else ">"
        return Eval(c, False, kind=OutcomeKind.BELOW_THRESHOLD, value=value, detail=detail,
                    reason=f"{c.metric.aggregate} {value:g} {rel} threshold {c.threshold_text}")
    return Eval(c, True, permitted=max(_arrived(f) for f in rows), value=value, detail=detail,
                reason=f"{c.metric.aggregate} {value:g} crossed threshold {c.threshold_text}")


def census_count(plan: Plan, st: EntityState, c: CondPlan, now: float) -> int:
    rows = current(st, plan, c)
    f: Fact  # noqa: F842 - compiled, this types the comprehensions' f (conditions.pxd)
    if c.window is not None:
        start = window_start(c, now)
        return sum(1 for f in rows if start <= f.created <= now)
    return len(rows) + st.census_base.get(c.cid, 0)


def _census(plan: Plan, st: EntityState, d: DerivationPlan, ds: DState, c: CondPlan,
            now: float, fresh: Any) -> Eval:
    count = census_count(plan, st, c, now)
    f: Fact  # noqa: F842 - compiled, this types the comprehensions' f (conditions.pxd)
    detail = {"value": count, "threshold": c.threshold, "fresh": len(fresh)}
    if count < c.threshold:
        return Eval(c, False, kind=OutcomeKind.CENSUS_BELOW, value=count, detail=detail,
                    reason=f"census {count} < threshold {c.threshold_text}")
    if not fresh:
        return Eval(c, False, kind=OutcomeKind.NO_PENDING, value=count, detail=detail,
                    reason=f"census {count} >= {c.threshold_text} but no new driving data "
                           f"above watermark {ds.w}")
    return Eval(c, True, permitted=max(_arrived(f) for f in fresh), value=count, detail=detail,
                reason=f"census {count} >= threshold {c.threshold_text} with new data")


def _lifecycle(plan: Plan, st: EntityState, d: DerivationPlan, ds: DState, c: CondPlan,
               now: float, fresh: Any) -> Eval:
    if not fresh:
        return Eval(c, False, kind=OutcomeKind.NO_PENDING, value=ds.total,
                    reason=f"no new driving data above watermark {ds.w}")
    reasons = []
    if c.first_record and ds.last_success is None:
        reasons.append("first record: never ran successfully")
    if c.total_records is not None and ds.total >= c.total_records:
        reasons.append(f"total records {ds.total} >= {c.total_records}")
    if not reasons:
        parts = []
        if c.first_record:
            parts.append(f"already ran at {_ts(ds.last_success)}")
        if c.total_records is not None:
            parts.append(f"total records {ds.total} < {c.total_records}")
        return Eval(c, False, kind=OutcomeKind.LIFECYCLE_NOT_MET, value=ds.total,
                    reason="; ".join(parts), detail={"total": ds.total})
    return Eval(c, True, permitted=min(_arrived(f) for f in fresh), value=ds.total,
                reason="; ".join(reasons), detail={"total": ds.total})


def _quiet(plan: Plan, st: EntityState, d: DerivationPlan, ds: DState, c: CondPlan,
           now: float, fresh: Any) -> Eval:
    hits = [f for f in fresh if c.cid in f.cond]
    if not hits:
        return Eval(c, False, kind=OutcomeKind.NO_PENDING, value=0,
                    reason=f"no matching record above watermark {ds.w}")
    arrivals = [_arrived(f) for f in hits]
    settle_at = max(arrivals) + c.after_s
    if c.max_wait_s is not None:
        settle_at = min(settle_at, min(arrivals) + c.max_wait_s)
    detail = {"settles_at": _ts(settle_at), "records": len(hits)}
    if now < settle_at:
        return Eval(c, False, permitted=settle_at, settle=True, kind=OutcomeKind.NOT_SETTLED,
                    value=len(hits), reason=f"not settled until {_ts(settle_at)}", detail=detail,
                    stimulus=True)
    return Eval(c, True, permitted=settle_at, settle=True, detail=detail, value=len(hits),
                reason=f"quiet since {_ts(max(arrivals))}")


def _at(plan: Plan, st: EntityState, d: DerivationPlan, ds: DState, c: CondPlan,
        now: float, fresh: Any) -> Eval:
    handled = ds.handled
    deadlines = sorted((f.cond[c.cid], f.seq) for f in current(st, plan, c)
                       if isinstance(f.cond.get(c.cid), float | int))
    open_ = [(t, s) for t, s in deadlines if handled is None or t > handled]
    if not open_:
        return Eval(c, False, kind=OutcomeKind.NO_PENDING,
                    reason="no unhandled deadline" + (f" after {_ts(handled)}" if handled else ""))
    t, seq = open_[0]
    detail = {"deadline": _ts(t), "seq": seq}
    if now < t:
        return Eval(c, True, permitted=t, kind=OutcomeKind.AT_SCHEDULED, value=t, detail=detail,
                    reason=f"scheduled for {_ts(t)} (seq {seq})")
    return Eval(c, True, permitted=t, value=t, detail=detail,
                reason=f"deadline {_ts(t)} of seq {seq} is due")


def _external(plan: Plan, st: EntityState, d: DerivationPlan, ds: DState, c: CondPlan,
              now: float, fresh: Any) -> Eval:
    # cron and read fire from their own events (CronFire, Read), never from data.
    return Eval(c, False, kind=None, reason=f"{c.kind} fires on its own events")


#: the kinds that read the derivation's pending records
PENDING_KINDS = frozenset({"write", "accumulator", "census", "lifecycle", "quiet"})

KINDS = {"write": _write, "changed": _changed, "retraction": _changed,
          "accumulator": _accumulator, "census": _census, "lifecycle": _lifecycle,
          "quiet": _quiet, "at": _at, "cron": _external, "read": _external}


def relevant(cond: CondPlan, d: DerivationPlan, fact: Fact) -> bool:
    """Is this record's arrival a stimulus for the condition (for outcomes and debounce)?"""
    kind = cond.kind
    if kind == "census":
        return cond.cid in fact.cond or d.index in fact.drive
    if kind == "lifecycle":
        return d.index in fact.drive
    if kind == "cron" or kind == "read":
        return False
    return in_scope(fact, cond.cid)


def last_relevant_arrivals(plan: Plan, st: EntityState, cond: CondPlan,
                           fresh: list[Fact] | None = None) -> tuple[float, float] | None:
    """(first, last) arrival among pending records relevant to ``cond`` (for debounce);
    ``fresh``: the pending records of its derivation, when the caller has them."""
    d = plan.derivations[cond.derivation]
    rows = [f for f in (pending(st, d) if fresh is None else fresh) if relevant(cond, d, f)]
    if not rows:
        return None
    arr = [_arrived(f) for f in rows]
    return min(arr), max(arr)
