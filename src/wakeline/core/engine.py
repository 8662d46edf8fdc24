# cython: annotation_typing=True
"""The condition engine: ``apply(state, event, now) -> Step``.

Pure: no I/O and no clock of its own.  ``apply`` takes ownership of the state it
is given (callers must use ``step.state`` afterwards) so it can update in place
without copying.  Outcomes, dispatched jobs, merged stimuli and freshness
entries come back in the :class:`Step`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

try:  # compiled: Cython's decorators (see _nocython)
    import cython
except ImportError:  # run as source without Cython
    from wakeline.core import _nocython as cython

from wakeline.core import conditions as C
from wakeline.core.conditions import Eval
from wakeline.core.events import (
    CronFire,
    CursorAdvanced,
    Event,
    ManualRun,
    Read,
    RecordChanged,
    Reevaluate,
    SlotRestored,
    Tick,
)
from wakeline.core.outcomes import Outcome, OutcomeKind
from wakeline.core.plan import DATA_KINDS, DerivationPlan, Fact, Plan, Rec, TriggerPlan
from wakeline.core.state import DState, EntityState, Job

UNREADY_ALERT_S = 300.0
_LOW = (1 << 64) - 1


def order_of(event: RecordChanged | CursorAdvanced) -> int:
    """Where a change stands in an entity's order, the redelivery guard's key: its
    position (``lsn``, commit order), then its record's ``seq``.  The position alone
    does not tell apart the rows of one ``COPY``: PostgreSQL writes them in multi-insert
    WAL records, every row of one record at the same LSN, in the order of their seqs.
    A cursor's change is one row's insert or update (never a multi-insert): seq 0.

    ``EntityState.last_lsn`` holds the last order applied negated; a positive value is
    the bare position an older version stored (:func:`_admit`)."""
    if isinstance(event, RecordChanged):
        rec = event.after if event.after is not None else event.before
        return (event.lsn << 64) | (rec.seq & _LOW if rec is not None else 0)
    return event.lsn << 64


def _admit(state: EntityState, event: RecordChanged | CursorAdvanced) -> bool:
    """False for a redelivery (at or below the last change applied to the entity);
    otherwise the change is recorded as the entity's last (``last_lsn``, negated)."""
    if not event.lsn:
        return True
    order = order_of(event)
    last = state.last_lsn
    if last > 0:  # a bare position stored by an older version: every change at it applied
        last = -((last << 64) | _LOW)
    if order <= -last:
        return False
    state.last_lsn = -order
    return True


#: Reasons whose permitted time comes from a request, not from entity state:
#: they survive post-run re-evaluation and merge by keeping the earliest time.
_EXTERNAL = ("manual", ":read", ":cron")


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


@dataclass(frozen=True)
class Dispatch:
    """A job leaving the mailbox for the derive topic."""

    job_id: str
    workspace: str
    entity: str
    derivation: str
    reasons: list[str]
    run_after: float
    enqueued_at: float
    dispatched_at: float
    watermark: int
    dedupe: list[str] = field(default_factory=list)


@dataclass
@cython.no_gc
@cython.cclass
class JobInfo:
    __slots__ = ("job_id", "coalesced", "run_after", "derivation", "entity")

    job_id: str
    coalesced: bool
    run_after: float
    derivation: str
    entity: str


@dataclass(init=False)  # __init__ below: see engine.pxd
@cython.no_gc
@cython.cclass
class Step:
    __slots__ = ("state", "outcomes", "dispatched", "merged", "freshness", "job",
                 "duplicate", "reload")

    state: EntityState
    outcomes: list[Outcome]
    dispatched: list[Dispatch]
    merged: list[JobInfo]
    freshness: list[dict[str, Any]]
    job: JobInfo | None
    duplicate: bool
    #: Slots ``(collection, key, below)`` whose prior row the core has forgotten and
    #: now needs (an erasure removed the oldest row it kept).  The caller answers each
    #: with a :class:`SlotRestored` read from PostgreSQL before the next event.
    reload: list[tuple[str, str, int]]

    def __init__(self, state: EntityState, outcomes: list[Outcome] | None = None,
                 dispatched: list[Dispatch] | None = None, merged: list[JobInfo] | None = None,
                 freshness: list[dict[str, Any]] | None = None, job: JobInfo | None = None,
                 duplicate: Any = False, reload: list[tuple[str, str, int]] | None = None,
                 ) -> None:
        self.state = state
        self.outcomes = [] if outcomes is None else outcomes
        self.dispatched = [] if dispatched is None else dispatched
        self.merged = [] if merged is None else merged
        self.freshness = [] if freshness is None else freshness
        self.job = job
        self.duplicate = duplicate
        self.reload = [] if reload is None else reload


def _in_chain(f: Fact) -> bool:
    return f.key is not None and f.ready and f.active


class Engine:
    """Hosts a :class:`Plan` and operator pauses; evaluates events per entity."""

    def __init__(self, plan: Plan, *, unready_alert_s: float = UNREADY_ALERT_S) -> None:
        self.plan = plan
        self._names = [d.name for d in plan.by_index]
        #: per derivation index, every condition evaluated on data and time in declaration
        #: order (cron and read fire on their own events): (trigger, condition, reads
        #: pending records, evaluator)
        self._evaluators = [tuple((t, c, c.kind in C.PENDING_KINDS, C.KINDS[c.kind])
                                  for t in d.triggers for c in t.conds
                                  if c.kind not in ("cron", "read")) for d in plan.by_index]
        #: the derivations a Tick re-evaluates: a windowed ``lte`` condition can start to
        #: hold with no new record, as rows leave its window
        self._ticked = [d for d in plan.by_index if any(
            c.window is not None and c.comparison == "lte" for t in d.triggers for c in t.conds)]
        self.unready_alert_s = unready_alert_s
        self.paused: dict[str, tuple[str, float | None]] = {}
        self._at: tuple[float, datetime] = (float("nan"), _dt(0.0))

    # -- operator controls ----------------------------------------------------

    def pause(self, trigger: str, reason: str = "operator", until: float | None = None) -> None:
        self.paused[trigger] = (reason, until)

    def resume(self, trigger: str) -> None:
        self.paused.pop(trigger, None)

    def is_paused(self, trigger: str, now: float) -> tuple[str, float | None] | None:
        p = self.paused.get(trigger)
        if p is None:
            return None
        if p[1] is not None and now >= p[1]:
            return None
        return p

    # -- the one entry point --------------------------------------------------

    def apply(self, state: EntityState, event: Event, now: float) -> Step:
        step = Step(state)
        if isinstance(event, RecordChanged):
            if not _admit(state, event):
                step.duplicate = True
                return step
            touched = self._on_record(step, event, now)
            if touched:
                self._evaluate_all(step, touched, now, fact=self._fact_of(state, event))
        elif isinstance(event, CursorAdvanced):
            if not _admit(state, event):
                step.duplicate = True
                return step
            self._on_cursor(step, event, now)
        elif isinstance(event, ManualRun):
            d = self.plan.derivations[event.derivation]
            r = event.run_after if event.run_after is not None else now
            step.job = self._merge(step, d, "manual", r, now, external=True)
        elif isinstance(event, Read):
            self._on_read(step, event, now)
        elif isinstance(event, CronFire):
            self._on_cron(step, event, now)
        elif isinstance(event, SlotRestored):
            self._on_restored(step, event, now)
        elif isinstance(event, Reevaluate):
            self._evaluate_all(step, [d for d in self.plan.by_index if event.derivation in (
                None, d.name) and d.name in state.ds], now)
        elif isinstance(event, Tick):
            self._evaluate_all(step, [d for d in self._ticked if d.name in state.ds], now)
        if state.unready:
            self._alert_unready(step, now)
        ds: DState
        for name, ds in state.ds.items():
            if ds.queued is not None:
                self._dispatch(step, self.plan.derivations[name], now)
        return step

    # -- records --------------------------------------------------------------

    def _fact_of(self, st: EntityState, ev: RecordChanged) -> Fact | None:
        if ev.after is None:
            return None
        return st.facts.get(ev.after.seq)

    def _on_record(self, step: Step, ev: RecordChanged, now: float) -> list[DerivationPlan]:
        st, plan = step.state, self.plan
        touched: set[int] = set()
        seq = (ev.after or ev.before).seq  # type: ignore[union-attr]
        old: Fact | None = st.facts.pop(seq, None)
        if old is not None:
            self._forget(st, old, folded=False)
            touched |= self._derivations_of(old)
        elif ev.before is not None and ev.before.ready and seq not in st.unready:
            # The old row was folded out of the facts: unfold its counters.
            before = plan.featurize(ev.before)
            if before is not None and ev.op in ("u", "d"):
                self._forget(st, before, folded=True)
                touched |= self._derivations_of(before)
        st.unready.pop(seq, None)
        if ev.op != "d" and ev.after is not None:
            rec: Rec = ev.after
            if not rec.ready:
                drive = tuple(d.index for d in plan.by_index if d.source.base_match(rec))
                if drive:
                    st.unready[seq] = [rec.created_at, drive]
                    for i in drive:
                        st.d(plan.by_index[i].name)
                    touched |= set(drive)
            else:
                fact: Fact | None = plan.featurize(rec)
                if fact is not None:
                    st.facts[seq] = fact
                    names, dss = self._names, st.ds
                    for i in fact.drive:
                        (dss.get(names[i]) or st.d(names[i])).total += 1
                    of = self._derivations_of(fact)
                    touched |= of
                    for i in of:
                        if names[i] not in dss:
                            st.d(names[i])
                    self._prune(st, fact, now=now)
                    if fact.key is not None:
                        self._trim_chains(st, (fact.coll, fact.key))
        if old is not None and _in_chain(old) and old.coll in plan.slot_collections:
            now_fact = st.facts.get(seq)
            if (now_fact is None or not _in_chain(now_fact)) and not any(
                    _in_chain(f) and f.coll == old.coll and f.key == old.key and f.seq < seq
                    for f in st.facts.values()):
                # The row left its slot's chain and no older row is remembered: the
                # previous one (forgotten once consumed) may be the head again.
                step.reload.append((old.coll, old.key, seq))
        return [plan.by_index[i] for i in sorted(touched)]

    def _on_restored(self, step: Step, ev: SlotRestored, now: float) -> None:
        st, rec = step.state, ev.record
        if rec is None or rec.seq in st.facts or rec.seq >= ev.below or not rec.ready \
                or rec.status != "active" or (rec.collection, rec.key) != (ev.collection, ev.key):
            return
        fact = self.plan.featurize(rec)
        if fact is None:
            return
        # Counted in the history totals when it first arrived; pruning kept the count.
        st.facts[rec.seq] = fact
        for i in sorted(self._derivations_of(fact)):
            self._evaluate(step, self.plan.by_index[i], now)

    def _derivations_of(self, fact: Fact) -> set[int]:
        out = set(fact.drive)
        index_of = self.plan.derivation_index_of_cid
        for cid in fact.cond:
            out.add(index_of[cid])
        return out

    def _forget(self, st: EntityState, fact: Fact, *, folded: bool) -> None:
        for i in fact.drive:
            ds = st.d(self.plan.by_index[i].name)
            ds.total = max(0, ds.total - 1)
        if folded:
            for cid in fact.cond:
                c = self.plan.conds_by_cid[cid]
                if c.kind == "census" and c.window is None and fact.key is None:
                    st.census_base[cid] = max(0, st.census_base.get(cid, 0) - 1)

    # -- pruning: keep only the facts some condition can still read -------------

    def _needed(self, st: EntityState, f: Fact, now: float) -> bool:
        plan, names, dss = self.plan, self._names, st.ds
        for i in f.drive:
            if f.seq > (dss.get(names[i]) or st.d(names[i])).w:
                return True
        if f.key is not None:
            return True  # keyed chains are trimmed by _trim_chains
        for cid, value in f.cond.items():
            c = plan.conds_by_cid[cid]
            if c.kind == "at":
                handled = st.d(c.derivation).handled
                if handled is None or value > handled:
                    return True
            elif c.kind == "census" and c.window is not None:
                if f.created >= now - c.window[0]:
                    return True
        return False

    def _fold(self, st: EntityState, f: Fact) -> None:
        for cid in f.cond:
            c = self.plan.conds_by_cid[cid]
            if c.kind == "census" and c.window is None and not f.tomb:
                st.census_base[cid] = st.census_base.get(cid, 0) + 1
        del st.facts[f.seq]

    def _prune(self, st: EntityState, fact: Fact | None = None, *, now: float) -> None:
        candidates = [fact] if fact is not None else list(st.facts.values())
        for f in candidates:
            if f.seq in st.facts and not self._needed(st, f, now):
                self._fold(st, f)
        if fact is None:
            self._trim_chains(st)

    def _trim_chains(self, st: EntityState, slot: tuple[str, str] | None = None) -> None:
        """Forget chain rows no condition can read again: all but the head, and the
        predecessor of the oldest row a transition condition has not consumed.
        (An erasure that needs a forgotten row asks for it: :attr:`Step.reload`.)"""
        plan = self.plan
        if slot is None:
            chains = C.chains(st, plan.keyed)
        else:
            chains = {slot: sorted((f for f in st.facts.values()
                                    if f.key == slot[1] and f.coll == slot[0] and f.ready
                                    and f.active), key=C._SEQ)}
        for (coll, _key), chain in chains.items():
            # The oldest watermark of a derivation that reads transitions of this
            # collection: entries before its predecessor can never matter again.
            readers = plan.transition_readers.get(coll)
            floor = min(st.d(name).w for name in readers) if readers else None
            keep_from = len(chain) - 1
            if floor is not None:
                for i, f in enumerate(chain):
                    if f.seq > floor:
                        keep_from = max(0, i - 1)
                        break
            for f in chain[:keep_from]:
                if all(f.seq <= st.d(plan.by_index[i].name).w for i in f.drive):
                    del st.facts[f.seq]
        if slot is not None:
            return
        # Keyed rows that are not in any chain (unready-then-archived, other statuses).
        for f in list(st.facts.values()):
            if f.key is not None and not f.active and all(
                    f.seq <= st.d(plan.by_index[i].name).w for i in f.drive):
                del st.facts[f.seq]

    # -- evaluation and the mailbox --------------------------------------------

    def _evaluate_all(self, step: Step, ds: list[DerivationPlan], now: float, *,
                      fact: Fact | None = None) -> None:
        """Evaluate several derivations on the same facts: their ready facts sorted once."""
        ready = C.ready_facts(step.state) if len(ds) > 1 else None
        for d in ds:
            self._evaluate(step, d, now, fact=fact, ready=ready)

    def _evaluate(self, step: Step, d: DerivationPlan, now: float, *, fact: Fact | None = None,
                  after_run: bool = False, ready: list[Fact] | None = None) -> None:
        """``ready``: ``C.ready_facts`` of the state, when the caller evaluates several
        derivations on the same facts."""
        st = step.state
        ds: DState = st.ds.get(d.name) or st.d(d.name)
        plan = self.plan
        ev: Eval
        # Every condition of d reads the same pending records: facts and the
        # watermark do not change while it is evaluated (only the mailbox does).
        fresh: list[Fact] | None = None
        for trig, cond, reads_pending, evaluator in self._evaluators[d.index]:
            if fresh is None and reads_pending:
                fresh = C.pending(st, d, ready)
            ev = evaluator(plan, st, d, ds, cond, now, fresh)
            is_relevant = fact is not None and C.relevant(cond, d, fact)
            if not ev.holds and not ev.stimulus:
                # A queued reason whose condition stopped holding (its data was
                # consumed, its deadline moved or was cancelled) leaves the job.
                if ds.queued and cond.reason in ds.queued.reasons:
                    del ds.queued.reasons[cond.reason]
                if is_relevant and ev.kind is not None:
                    self._outcome(step, ev.kind, ev.reason, now, d, trig, ev.detail)
                continue
            paused = self.is_paused(trig.name, now) if self.paused else None
            if paused is not None:
                if is_relevant or after_run:
                    self._outcome(step, OutcomeKind.PAUSED, f"trigger paused: {paused[0]}",
                                  now, d, trig, {"until": C._ts(paused[1])})
                continue
            r = self._pace(step, trig, cond, ev, ds, now, record=is_relevant or after_run,
                           fresh=fresh)
            if ev.kind in (OutcomeKind.NOT_SETTLED, OutcomeKind.AT_SCHEDULED) and is_relevant:
                self._outcome(step, ev.kind, ev.reason, now, d, trig, ev.detail)
            self._merge(step, d, cond.reason, r, now, settle=ev.settle)
        if ds.queued is not None and not ds.queued.reasons:
            ds.queued = None

    def _pace(self, step: Step, trig: TriggerPlan, cond: Any, ev: C.Eval, ds: DState,
              now: float, *, record: bool, fresh: list[Fact] | None = None) -> float:
        """``fresh``: the pending records of the trigger's derivation, when known."""
        assert ev.permitted is not None
        r = ev.permitted
        d = self.plan.derivations[trig.derivation]
        if trig.cooldown_s and ds.last_success is not None:
            cool = ds.last_success + trig.cooldown_s
            if cool > r:
                r = cool
                if record and cool > now:
                    self._outcome(step, OutcomeKind.COOLDOWN, f"cooling until {C._ts(cool)}",
                                  now, d, trig, {"until": C._ts(cool), "condition": cond.kind})
        if trig.debounce_s and cond.kind in DATA_KINDS:
            span = C.last_relevant_arrivals(self.plan, step.state, cond, fresh)
            if span is not None:
                deb = span[1] + trig.debounce_s
                if trig.max_wait_s is not None:
                    deb = min(deb, span[0] + trig.max_wait_s)
                if deb > r:
                    r = deb
                    if record and deb > now:
                        self._outcome(step, OutcomeKind.DEBOUNCE,
                                      f"debouncing until {C._ts(deb)}", now, d, trig,
                                      {"until": C._ts(deb), "condition": cond.kind})
        return r

    def _merge(self, step: Step, d: DerivationPlan, reason: str, r: float, now: float, *,
               settle: bool = False, external: bool = False, dedupe: str | None = None) -> JobInfo:
        st = step.state
        ds: DState = st.d(d.name)
        q: Job | None = ds.queued
        coalesced = q is not None
        if q is None:
            ds.jobs_made += 1
            # The instant keeps ids unique when state is rebuilt after a restart.
            q = ds.queued = Job(f"{st.workspace}/{d.name}/{st.entity}/"
                                f"{int(now * 1000):x}.{ds.jobs_made}", {}, now)
        if reason in q.reasons and (external or reason.endswith(_EXTERNAL)):
            q.reasons[reason] = min(q.reasons[reason], r)
        else:
            q.reasons[reason] = r
        if settle and reason not in q.settle:
            q.settle.append(reason)
        if dedupe and dedupe not in q.dedupe:
            q.dedupe.append(dedupe)
        info = JobInfo(q.id, coalesced, q.run_after, d.name, st.entity)
        step.merged.append(info)
        return info

    def _dispatch(self, step: Step, d: DerivationPlan, now: float) -> None:
        st = step.state
        ds: DState = st.ds[d.name]
        q: Job | None = ds.queued
        if q is None or q.run_after > now or ds.running is not None:
            return
        u = C.gate(st, d)
        if u is not None:
            if ds.waiting_on != u:
                ds.waiting_on = u
                self._outcome(step, OutcomeKind.PENDING_UNREADY,
                              f"waiting on unready seq {u}", now, d, None,
                              {"seq": u, "job_id": q.id})
            return
        ds.waiting_on = None
        q.dispatched = now
        ds.running, ds.queued = q, None
        step.dispatched.append(Dispatch(q.id, st.workspace, st.entity, d.name, q.sorted_reasons(),
                                        q.run_after, q.created, now, ds.w, list(q.dedupe)))

    def _alert_unready(self, step: Step, now: float) -> None:
        st = step.state
        for seq, (created, drive) in st.unready.items():
            if seq not in st.alerted and now >= created + self.unready_alert_s:
                st.alerted.append(seq)
                d = self.plan.by_index[drive[0]]
                self._outcome(step, OutcomeKind.UNREADY_STALLED,
                              f"record seq {seq} still unready after "
                              f"{self.unready_alert_s:g}s; it blocks the watermark",
                              now, d, None, {"seq": seq, "since": C._ts(created)})
        if st.alerted:
            st.alerted = [s for s in st.alerted if s in st.unready]

    # -- runs ---------------------------------------------------------------------

    def _on_cursor(self, step: Step, ev: CursorAdvanced, now: float) -> None:
        st = step.state
        d = self.plan.derivations[ev.derivation]
        ds = st.d(d.name)
        if ds.running is not None and (ev.job_id is None or ds.running.id == ev.job_id):
            ds.running = None
        ds.last_run = max(ds.last_run or ev.finished_at, ev.finished_at)
        if ev.outcome in ("succeeded", "noop"):
            ds.w = max(ds.w, ev.watermark)
            ds.last_success = max(ds.last_success or ev.finished_at, ev.finished_at)
            ds.handled = max(ds.handled or ev.finished_at, ev.finished_at)
            ds.dead = False
            self._prune(st, now=now)
            # Invariant 5: every trigger of the derivation is re-evaluated
            # against the advanced watermark; what still holds is the successor.
            self._evaluate(step, d, now, after_run=True)
        else:
            ds.dead = ev.outcome == "dead"

    # -- pull and operator ----------------------------------------------------------

    def _on_read(self, step: Step, ev: Read, now: float) -> None:
        st = step.state
        for d in self.plan.by_index:
            trig = d.read_trigger
            if trig is None:
                continue
            ds = st.d(d.name)
            dirty = bool(C.pending(st, d))
            lowest_u = C.lowest_unready(st, d)
            pend = C.pending(st, d)
            pending_unready = lowest_u is not None and (not pend or lowest_u < pend[0].seq)
            stale = ev.max_staleness is not None and (
                ds.last_success is None or now - ds.last_success > ev.max_staleness)
            job: str | None = None
            if dirty or stale:
                paused = self.is_paused(trig.name, now)
                if paused is not None:
                    self._outcome(step, OutcomeKind.PAUSED, f"trigger paused: {paused[0]}",
                                  now, d, trig, {})
                else:
                    read_cond = next(c for c in trig.conds if c.kind == "read")
                    r = self._pace(step, trig, read_cond,
                                   C.Eval(read_cond, True, permitted=now), ds, now, record=True)
                    info = self._merge(step, d, read_cond.reason, r, now, external=True)
                    job = "coalesced" if info.coalesced else "enqueued"
            elif ds.running is not None or ds.queued is not None:
                job = "running" if ds.running is not None else "queued"
            elif ds.dead:
                job = "dead"
            step.freshness.append({
                "derivation": d.name,
                "last_run_at": C._ts(ds.last_success),
                "watermark": ds.w,
                "dirty": dirty,
                "pending_unready": pending_unready,
                "job": job,
                "error_kind": "dead" if ds.dead else None,
            })

    def _on_cron(self, step: Step, ev: CronFire, now: float) -> None:
        st = step.state
        trig = self.plan.triggers[ev.trigger]
        d = self.plan.derivations[trig.derivation]
        cond = next(c for c in trig.conds if c.kind == "cron")
        ds = st.d(d.name)
        bucket_iso = C._ts(ev.bucket)
        if ds.cron_last.get(trig.name, float("-inf")) >= ev.bucket:
            self._outcome(step, OutcomeKind.DUPLICATE_CRON,
                          f"bucket {bucket_iso} already applied", now, d, trig,
                          {"bucket": bucket_iso})
            return
        ds.cron_last[trig.name] = ev.bucket
        if cond.cron_entities == "dirty" and not C.pending(st, d):
            self._outcome(step, OutcomeKind.CRON_CLEAN,
                          f"no driving data above watermark {ds.w} at bucket {bucket_iso}",
                          now, d, trig, {"bucket": bucket_iso})
            return
        paused = self.is_paused(trig.name, now)
        if paused is not None:
            self._outcome(step, OutcomeKind.PAUSED, f"trigger paused: {paused[0]}", now, d, trig,
                          {"bucket": bucket_iso})
            return
        r = self._pace(step, trig, cond, C.Eval(cond, True, permitted=now), ds, now, record=True)
        for earlier in ev.catchup:
            self._merge(step, d, cond.reason, r, now, external=True,
                        dedupe=f"cron:{d.name}:{C._ts(earlier)}")
        self._merge(step, d, cond.reason, r, now, external=True,
                    dedupe=f"cron:{d.name}:{bucket_iso}")

    # -- observability --------------------------------------------------------------

    def _outcome(self, step: Step, kind: OutcomeKind, reason: str, now: float,
                 d: DerivationPlan | None, trig: TriggerPlan | None,
                 detail: dict[str, Any] | None = None) -> None:
        at = self._at
        if at[0] != now:  # a batch evaluates many entities at one instant
            at = self._at = (now, _dt(now))
        step.outcomes.append(Outcome(kind, reason, at[1], step.state.workspace,
                                     step.state.entity, d.name if d else None,
                                     trig.name if trig else None, detail or {}))

    def next_wakeup(self, st: EntityState) -> float | None:
        """The next instant this entity needs a Tick (O(derivations))."""
        return self.wakeup_and_running(st)[0]

    def wakeup_and_running(self, st: EntityState) -> tuple[float | None, bool]:
        """:meth:`next_wakeup`, and whether a job of the entity is running: what the
        state changelog carries ahead of each state, in one pass over its mailboxes."""
        wake: float | None = None
        running = False
        derivations = self.plan.derivations
        ds: DState
        for name, ds in st.ds.items():
            if ds.running is not None:
                running = True
            elif ds.queued is not None:
                d = derivations.get(name)
                if d is not None and C.gate(st, d) is None:
                    t = ds.queued.run_after
                    if wake is None or t < wake:
                        wake = t
        if st.unready:
            alert = self.unready_alert_s
            for seq, (created, _drive) in st.unready.items():
                if seq not in st.alerted:
                    t = created + alert
                    if wake is None or t < wake:
                        wake = t
        return wake, running

    def explain(self, st: EntityState, trigger: str, now: float) -> list[dict[str, Any]]:
        """For each condition of ``trigger``: does it hold now, and why (not)."""
        trig = self.plan.triggers[trigger]
        d = self.plan.derivations[trig.derivation]
        ds = st.ds.get(d.name) or DState()
        out: list[dict[str, Any]] = []
        for cond in trig.conds:
            if cond.kind == "read":
                out.append({"condition": "read", "holds": False,
                            "reason": "fires when the entity is read (GET /document)"})
                continue
            if cond.kind == "cron":
                out.append({"condition": "cron", "holds": False,
                            "reason": f"fires on schedule {cond.cron_expr!r} "
                                      f"(entities: {cond.cron_entities})"})
                continue
            ev = C.evaluate(self.plan, st, cond, now)
            entry: dict[str, Any] = {"condition": cond.kind, "holds": ev.holds,
                                     "reason": ev.reason, "value": ev.value, **ev.detail}
            if ev.holds or ev.stimulus:
                waits = []
                if trig.cooldown_s and ds.last_success is not None \
                        and ds.last_success + trig.cooldown_s > now:
                    waits.append(f"cooling until {C._ts(ds.last_success + trig.cooldown_s)}")
                if trig.debounce_s and cond.kind in DATA_KINDS:
                    span = C.last_relevant_arrivals(self.plan, st, cond)
                    if span and span[1] + trig.debounce_s > now:
                        waits.append(f"debouncing until {C._ts(span[1] + trig.debounce_s)}")
                u = C.gate(st, d)
                if u is not None:
                    waits.append(f"waiting on unready seq {u}")
                if self.is_paused(trig.name, now):
                    waits.append("trigger paused")
                if waits:
                    entry["waiting"] = waits
            out.append(entry)
        return out
