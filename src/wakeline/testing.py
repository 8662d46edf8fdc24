"""``wakeline.testing``: step a catalog through events with a controlled clock.

The :class:`Simulator` runs the real condition core (:mod:`wakeline.core`) and
the catalog's real derivation callables over an in-memory record table, with a
:class:`~wakeline.clock.ManualClock`.  No services are involved, so users can
test their catalogs in plain pytest:

    >>> sim = Simulator("catalog/", start="2026-07-19T09:00:00Z")      # doctest: +SKIP
    >>> seq = sim.write(entity="user:mia", collection="main", type="chat",
    ...                 content={"text": "hi"})                         # doctest: +SKIP
    >>> sim.advance(seconds=900)                                      # doctest: +SKIP
    >>> sim.runs[-1]["trigger_reasons"]                               # doctest: +SKIP

Runs start when their job is due and take ``run_duration`` seconds (default 0:
they complete at the instant they start).  A run reads its input when it starts
and commits its emissions, the watermark advance and its run row when it ends,
like the derive worker.  ``fail=`` makes runs fail: a callable
``(derivation, entity, attempt) -> exception | None``.  Failures are classified
like the derive worker does (:func:`wakeline.derive.errors.classify`): transient
ones (:class:`Transient`, and unexpected exceptions) are retried with exponential
backoff up to ``max_attempts``; :class:`PermanentError`, configuration errors and
timeouts are not.  Either way the job ends ``dead`` and says so.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wakeline.catalog import Catalog, DerivationContext, compile_catalog, validate_emissions
from wakeline.clock import ManualClock, iso, parse_instant
from wakeline.core import conditions as C
from wakeline.core.build import build_plan
from wakeline.core.cron import MAX_CRON_CATCHUP, due_buckets, next_bucket
from wakeline.core.engine import Dispatch, Engine, Step
from wakeline.core.inputs import RunInput, definition_hashes, record_dict, select_input
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
from wakeline.core.plan import DerivationPlan, Rec
from wakeline.core.state import EntityState
from wakeline.derive.errors import PermanentError, TransientError, backoff, classify
from wakeline.errors import WakelineError

__all__ = ["PermanentError", "Simulator", "Transient"]

CRON_PAGE = 500


#: A failure worth retrying (the network blinked, a model was overloaded).
Transient = TransientError


class SimulatorError(WakelineError):
    code = "testing.simulator"


@dataclass
class _Running:
    dispatch: Dispatch
    started: float
    finishes: float
    attempt: int
    consumed: list[Rec]
    watermark_after: int
    emissions: list[dict[str, Any]] | None
    error: BaseException | None
    noop: bool


@dataclass(order=True)
class _Timer:
    at: float
    order: int
    kind: str = field(compare=False)
    payload: Any = field(compare=False)


def _epoch(value: datetime | str | float | None) -> float | None:
    if value is None or isinstance(value, float | int):
        return value
    return parse_instant(value).timestamp()


def _dt(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


class Simulator:
    """A whole Wakeline deployment in one process, on a manual clock."""

    def __init__(
        self,
        catalog: str | Path | Catalog,
        *,
        start: datetime | str = "2026-01-01T00:00:00Z",
        workspace: str = "default",
        run_duration: float = 0.0,
        fail: Callable[[str, str, int], BaseException | None] | None = None,
        max_attempts: int = 3,
        backoff_s: float = 2.0,
        unready_alert_s: float = 300.0,
        max_cron_catchup: int = MAX_CRON_CATCHUP,
    ) -> None:
        self.catalog = catalog if isinstance(catalog, Catalog) else compile_catalog(catalog)
        self.plan = build_plan(self.catalog)
        self.engine = Engine(self.plan, unready_alert_s=unready_alert_s)
        self.clock = ManualClock(start)
        self.workspace = workspace
        self.run_duration = run_duration
        self.fail = fail
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_cron_catchup = max_cron_catchup
        self.records: dict[int, Rec] = {}
        self._entity_of: dict[int, str] = {}
        self.states: dict[str, EntityState] = {}
        self.runs: list[dict[str, Any]] = []
        self.outcomes: list[Outcome] = []
        self.cron_pages: list[dict[str, Any]] = []
        self._seq = 0
        self._lsn = 0
        self._timers: list[_Timer] = []
        self._order = 0
        self._running: dict[str, _Running] = {}
        self._functions: dict[str, Callable[..., Any]] = {}
        self._cron_last: dict[str, float] = {}
        self._job_state: dict[str, dict[str, Any]] = {}
        for trig in self.plan.triggers.values():
            for cond in trig.conds:
                if cond.kind == "cron":
                    self._plan_cron(trig.name, cond.cron_expr, self._t())

    # -- time --------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def _t(self) -> float:
        return self.clock.now().timestamp()

    def advance(self, seconds: float = 0.0, *, down: bool = False) -> None:
        """Move the clock, firing everything that falls due on the way.

        ``down=True`` simulates an outage: nothing is processed while the clock
        moves, then cron catches up (bounded) and due jobs fire at the end.
        """
        target = self._t() + seconds
        if down:
            self.clock.set(_dt(target))  # type: ignore[arg-type]
            self._cron_catch_up()
            self._tick_all()
            return
        while True:
            t = self._next_event_time()
            if t is None or t > target:
                break
            if t > self._t():
                self.clock.set(_dt(t))  # type: ignore[arg-type]
            self._fire_due()
        self.clock.set(_dt(target))  # type: ignore[arg-type]
        self._tick_all()

    def _next_event_time(self) -> float | None:
        times = [self._timers[0].at] if self._timers else []
        for st in self.states.values():
            w = self.engine.next_wakeup(st)
            if w is not None:
                times.append(w)
        return min(times) if times else None

    def _fire_due(self) -> None:
        now = self._t()
        while self._timers and self._timers[0].at <= now:
            timer = heapq.heappop(self._timers)
            if timer.kind == "finish":
                self._finish(timer.payload)
            elif timer.kind == "retry":
                self._start(*timer.payload)
            elif timer.kind == "cron":
                self._cron_fire(*timer.payload)
        self._tick_all()

    def _tick_all(self) -> None:
        now = self._t()
        for entity, st in list(self.states.items()):
            w = self.engine.next_wakeup(st)
            if w is not None and w <= now:
                self._apply(entity, Tick())

    def _timer(self, at: float, kind: str, payload: Any) -> None:
        self._order += 1
        heapq.heappush(self._timers, _Timer(at, self._order, kind, payload))

    # -- the core ------------------------------------------------------------------

    def _state(self, entity: str) -> EntityState:
        st = self.states.get(entity)
        if st is None:
            st = self.states[entity] = EntityState(self.workspace, entity)
        return st

    def _apply(self, entity: str, event: Event) -> Step:
        step = self.engine.apply(self._state(entity), event, self._t())
        self.states[entity] = step.state
        self.outcomes.extend(step.outcomes)
        for coll, key, below in step.reload:   # an erasure needs a forgotten prior head
            self._apply(entity, SlotRestored(coll, key, below,
                                             self.head(entity, coll, key, below=below)))
        for dispatch in step.dispatched:
            self._job_state[dispatch.job_id] = {"state": "running", "attempts": 0}
            self._start(dispatch, 1)
        return step

    def _change(self, entity: str, op: str, after: Rec | None, before: Rec | None) -> Step:
        self._lsn += 1
        return self._apply(entity, RecordChanged(op, after, before, self._lsn))

    # -- records -------------------------------------------------------------------

    def _version(self, collection: str, version: int | None) -> int:
        coll = self.catalog.collections.get(collection)
        if coll is None:
            raise SimulatorError(f"unknown collection {collection!r}; declare it in the catalog")
        return version if version is not None else coll.active_version

    def write(
        self,
        *,
        entity: str,
        collection: str,
        type: str = "",
        status: str = "active",
        content: Mapping[str, Any] | None = None,
        text: str = "",
        key: str | None = None,
        ready: bool = True,
        scores: Mapping[str, Any] | None = None,
        annotations: Mapping[str, Any] | None = None,
        version: int | None = None,
        parents: tuple[int, ...] = (),
    ) -> int:
        """Insert a record (ready by default) and return its seq."""
        coll = self.catalog.collections.get(collection)
        if coll is None:
            raise SimulatorError(f"unknown collection {collection!r}; declare it in the catalog")
        if coll.keyed and not key:
            raise SimulatorError(f"{collection} is keyed: pass key=")
        if content and "tombstone" in content:
            raise SimulatorError("content may not set tombstone; use sim.retract()")
        return self._insert(entity, Rec(
            0, collection, self._version(collection, version), type, status,
            key if coll.keyed else None, dict(content or {}), text, False,
            dict(annotations or {}), dict(scores or {}), self._t() if ready else None,
            self._t(), tuple(parents)))

    def _insert(self, entity: str, rec: Rec) -> int:
        self._seq += 1
        rec = replace(rec, seq=self._seq)
        self.records[rec.seq] = rec
        self._entity_of[rec.seq] = entity
        self._change(entity, "c", rec, None)
        return rec.seq

    def mark_ready(self, seq: int, *, scores: Mapping[str, Any] | None = None,
                   annotations: Mapping[str, Any] | None = None) -> None:
        before = self.records[seq]
        if before.ready:
            return
        after = replace(before, enriched_at=self._t(),
                        scores={**before.scores, **(scores or {})},
                        annotations={**before.annotations, **(annotations or {})})
        self.records[seq] = after
        self._change(self._entity_of[seq], "u", after, before)

    def update(self, seq: int, **fields: Any) -> None:
        """Update a record in place (content, status, …) — e.g. move a dated event."""
        before = self.records[seq]
        after = replace(before, **fields)
        self.records[seq] = after
        self._change(self._entity_of[seq], "u", after, before)

    def delete(self, seq: int) -> None:
        """Physically delete a record (erasure)."""
        before = self.records.pop(seq)
        self._change(self._entity_of[seq], "d", None, before)

    def head(self, entity: str, collection: str, key: str, *, below: int | None = None
             ) -> Rec | None:
        """The slot's head: its latest ready active row (with ``seq < below``)."""
        rows = [r for s, r in self.records.items() if self._entity_of[s] == entity
                and r.collection == collection and r.key == key and r.ready
                and r.status == "active" and (below is None or s < below)]
        return max(rows, key=lambda r: r.seq) if rows else None

    def retract(self, *, entity: str, collection: str, key: str) -> int:
        """Write a tombstone for the live head of a keyed slot."""
        head = self.head(entity, collection, key)
        if head is None or head.tombstone:
            raise SimulatorError(f"{collection}.{key} of {entity} holds no live value")
        return self._insert(entity, Rec(
            0, collection, head.version, head.type, "active", key, {"tombstone": True}, "",
            True, {}, {}, self._t(), self._t(), (head.seq,)))

    # -- stimuli ---------------------------------------------------------------------

    def manual(self, derivation: str, entity: str, run_after: datetime | str | None = None
               ) -> dict[str, Any]:
        if derivation not in self.plan.derivations:
            raise SimulatorError(f"unknown derivation {derivation!r}")
        step = self._apply(entity, ManualRun(derivation, _epoch(run_after)))
        assert step.job is not None
        return {"job_id": step.job.job_id, "coalesced": step.job.coalesced,
                "run_after": iso(_dt(step.job.run_after))}

    def read(self, entity: str, max_staleness: float | None = None) -> list[dict[str, Any]]:
        """A GET /document: the freshness entries; never waits for a run."""
        return self._apply(entity, Read(max_staleness)).freshness

    def pause(self, trigger: str, *, until: datetime | str | None = None,
              reason: str = "operator") -> None:
        self.engine.pause(trigger, reason, _epoch(until))

    def resume(self, trigger: str) -> None:
        self.engine.resume(trigger)
        d = self.plan.triggers[trigger].derivation
        for entity in list(self.states):
            self._apply(entity, Reevaluate(d))

    # -- cron ------------------------------------------------------------------------

    def _plan_cron(self, trigger: str, expr: str, now: float) -> None:
        plan = due_buckets(expr, _dt(self._cron_last.get(trigger)), _dt(now),  # type: ignore[arg-type]
                           self.max_cron_catchup)
        d = self.plan.triggers[trigger].derivation
        for missed in plan.missed:
            self.outcomes.append(Outcome(OutcomeKind.MISSED_CRON,
                                         f"bucket {iso(missed)} skipped beyond the catch-up "
                                         f"bound of {self.max_cron_catchup}", _dt(now),
                                         self.workspace, "", d, trigger,
                                         {"bucket": iso(missed)}))
        if plan.fire:
            self._cron_fire(trigger, plan.fire[-1].timestamp(), schedule=False,
                            catchup=tuple(b.timestamp() for b in plan.fire[:-1]))
        if plan.last_bucket is not None:
            self._cron_last[trigger] = plan.last_bucket.timestamp()
        last = plan.last_bucket or _dt(now)
        assert last is not None
        self._timer(next_bucket(expr, last).timestamp(), "cron", (trigger, None))

    def _cron_fire(self, trigger: str, bucket: float | None, *, schedule: bool = True,
                   catchup: tuple[float, ...] = ()) -> None:
        trig = self.plan.triggers[trigger]
        cond = next(c for c in trig.conds if c.kind == "cron")
        if bucket is None:  # a scheduled timer: the bucket is the timer's own instant
            bucket = self._t()
        d = self.plan.derivations[trig.derivation]
        entities = sorted(e for e in self._seen_entities() if not e.startswith("_system"))
        if cond.cron_entities == "dirty":
            entities = [e for e in entities if C.pending(self._state(e), d)]
        for page_no, start in enumerate(range(0, max(len(entities), 1), CRON_PAGE)):
            page = entities[start:start + CRON_PAGE]
            self.cron_pages.append({"trigger": trigger, "bucket": iso(_dt(bucket)),
                                    "page": page_no, "entities": len(page),
                                    "dedupe": f"cron:{d.name}:{iso(_dt(bucket))}"})
            for entity in page:
                self._apply(entity, CronFire(trigger, bucket, catchup))
        if schedule:
            self._cron_last[trigger] = bucket
            self._timer(next_bucket(cond.cron_expr, _dt(bucket)).timestamp(),  # type: ignore[arg-type]
                        "cron", (trigger, None))

    def _cron_catch_up(self) -> None:
        # Drop the pending cron timers and plan again from the durable last bucket.
        self._timers = [t for t in self._timers if t.kind != "cron"]
        heapq.heapify(self._timers)
        for trig in self.plan.triggers.values():
            for cond in trig.conds:
                if cond.kind == "cron":
                    self._plan_cron(trig.name, cond.cron_expr, self._t())
        while self._timers and self._timers[0].at <= self._t():
            self._fire_due()

    def _seen_entities(self) -> set[str]:
        return set(self._entity_of.values())

    # -- runs ------------------------------------------------------------------------

    def _function(self, d: DerivationPlan) -> Callable[..., Any]:
        fn = self._functions.get(d.name)
        if fn is None:
            fn = self._functions[d.name] = self.catalog.load_function(d.name)
        return fn

    def _input(self, d: DerivationPlan, entity: str, watermark: int) -> RunInput:
        rows = [r for s, r in self.records.items() if self._entity_of[s] == entity]
        return select_input(d, rows, watermark)

    def _start(self, dispatch: Dispatch, attempt: int) -> None:
        d = self.plan.derivations[dispatch.derivation]
        st = self._state(dispatch.entity)
        watermark = st.ds[d.name].w
        inp = self._input(d, dispatch.entity, watermark)
        seen, consumed, after = inp.seen, inp.consumed, inp.watermark_after
        now = self._t()
        noop = not seen and not d.allow_empty
        emissions: list[dict[str, Any]] | None = None
        error: BaseException | None = None
        if self.fail is not None:
            error = self.fail(d.name, dispatch.entity, attempt)
        if error is None and not noop:
            ctx = DerivationContext(
                entity=dispatch.entity, derivation=d.name, now=_dt(now),  # type: ignore[arg-type]
                records=[record_dict(r) for r in seen], workspace=self.workspace,
                reasons=tuple(dispatch.reasons))
            try:
                emissions = validate_emissions(self.catalog, d.name, self._function(d)(ctx))
            except Exception as exc:  # the derivation's own failure is a run outcome
                error = exc
        self._job_state[dispatch.job_id] = {"state": "running", "attempts": attempt}
        run = _Running(dispatch, now, now + self.run_duration, attempt, consumed, after,
                       emissions, error, noop)
        self._running[dispatch.job_id] = run
        if self.run_duration <= 0:
            self._finish(dispatch.job_id)
        else:
            self._timer(run.finishes, "finish", dispatch.job_id)

    def _finish(self, job_id: str) -> None:
        run = self._running.pop(job_id)
        dispatch = run.dispatch
        d = self.plan.derivations[dispatch.derivation]
        now = self._t()
        base = {
            "job_id": job_id, "attempt": run.attempt, "derivation": d.name,
            "entity": dispatch.entity, "trigger_reasons": list(dispatch.reasons),
            "started_at": iso(_dt(run.started)), "finished_at": iso(_dt(now)),
            "watermark_before": dispatch.watermark,
            "definition_hashes": self._hashes(d, dispatch.reasons),
        }
        if run.error is not None:
            kind = classify(run.error)
            transient = kind == "transient"
            final = not transient or run.attempt >= self.max_attempts
            outcome = "dead" if final else "failed"
            self.runs.append({**base, "run_id": len(self.runs) + 1,
                              "watermark_after": dispatch.watermark, "records_consumed": 0,
                              "outcome": outcome, "error": repr(run.error),
                              "error_kind": kind})
            if not final:
                delay = backoff(run.attempt, self.backoff_s)
                self._job_state[job_id] = {"state": "retrying", "attempts": run.attempt}
                self._timer(now + delay, "retry", (dispatch, run.attempt + 1))
                return
            self._job_state[job_id] = {"state": "dead", "attempts": run.attempt}
            self.outcomes.append(Outcome(OutcomeKind.DEAD,
                                         f"job dead after {run.attempt} attempt(s): "
                                         f"{run.error!r}", _dt(now), self.workspace,
                                         dispatch.entity, d.name, None,
                                         {"job_id": job_id, "attempts": run.attempt}))
            self._lsn += 1
            self._apply(dispatch.entity, CursorAdvanced(d.name, dispatch.watermark, now, "dead",
                                                        job_id, self._lsn))
            return
        outcome = "noop" if run.noop else "succeeded"
        if run.noop:
            self.outcomes.append(Outcome(OutcomeKind.NOOP,
                                         "no driving rows; audited noop run", _dt(now),
                                         self.workspace, dispatch.entity, d.name, None,
                                         {"job_id": job_id}))
        # One transaction: the run row, its emissions and the watermark commit
        # together; their change events then reach the core in commit order.
        self.runs.append({**base, "run_id": len(self.runs) + 1,
                          "watermark_after": run.watermark_after,
                          "records_consumed": len(run.consumed), "outcome": outcome,
                          "error": None, "error_kind": None})
        for em in run.emissions or []:
            self._emit(dispatch.entity, em)
        self._job_state[job_id] = {"state": outcome, "attempts": run.attempt}
        self._lsn += 1
        self._apply(dispatch.entity, CursorAdvanced(d.name, run.watermark_after, now, outcome,
                                                    job_id, self._lsn))

    def _hashes(self, d: DerivationPlan, reasons: list[str]) -> dict[str, str]:
        return definition_hashes(self.plan.catalog_hash, d,
                                 {n: t.hash for n, t in self.plan.triggers.items()}, reasons)

    def _emit(self, entity: str, em: Mapping[str, Any]) -> None:
        coll = em["collection"]
        if em.get("retract"):
            head = self.head(entity, coll, em["key"])
            if head is not None and not head.tombstone:
                self.retract(entity=entity, collection=coll, key=em["key"])
            return
        self.write(entity=entity, collection=coll, type=em.get("type", ""),
                   content=em.get("content") or {}, text=em.get("text", ""),
                   key=em.get("key"), ready=True)

    # -- observing -------------------------------------------------------------------

    @property
    def jobs(self) -> list[dict[str, Any]]:
        """Queued and running jobs with their reasons and run_after."""
        out = []
        for entity, st in sorted(self.states.items()):
            for name, ds in sorted(st.ds.items()):
                for state, job in (("running", ds.running), ("queued", ds.queued)):
                    if job is None:
                        continue
                    js = self._job_state.get(job.id, {})
                    out.append({"job_id": job.id, "derivation": name, "entity": entity,
                                "state": js.get("state", state) if state == "running" else state,
                                "reasons": job.sorted_reasons(),
                                "run_after": iso(_dt(job.run_after)),
                                "attempts": js.get("attempts", 0)})
        return out

    def job(self, job_id: str) -> dict[str, Any] | None:
        for j in self.jobs:
            if j["job_id"] == job_id:
                return j
        js = self._job_state.get(job_id)
        return {"job_id": job_id, **js} if js else None

    def cursor(self, derivation: str, entity: str) -> dict[str, Any]:
        ds = self._state(entity).d(derivation)
        return {"watermark": ds.w, "last_success_at": iso(_dt(ds.last_success)),
                "last_run_at": iso(_dt(ds.last_run)),
                "at_handled_through": iso(_dt(ds.handled))}

    def explain(self, trigger: str, entity: str) -> dict[str, Any]:
        if trigger not in self.plan.triggers:
            raise SimulatorError(f"unknown trigger {trigger!r}")
        conds = self.engine.explain(self._state(entity), trigger, self._t())
        last = [o.to_dict() for o in self.outcomes
                if o.entity == entity and o.trigger == trigger][-10:]
        return {"trigger": trigger, "entity": entity, "conditions": conds,
                "last_outcomes": last}

    def evaluate(self, trigger: str, entity: str) -> list[dict[str, Any]]:
        """The core's raw answer per condition: holds, value, permitted time, detail.

        ``value`` is what the condition measures: the number of matching pending
        records (write, quiet), the number of transitions (changed, retraction), the
        aggregate (accumulator; None when undefined), the census count, the total
        driving history (lifecycle), the earliest unhandled deadline as epoch
        seconds (at).  Used by the differential tests against the SQL oracle.
        """
        trig = self.plan.triggers[trigger]
        st = self._state(entity)
        out = []
        for cond in trig.conds:
            if cond.kind in ("cron", "read"):
                continue
            ev = C.evaluate(self.plan, st, cond, self._t())
            out.append({"kind": cond.kind, "holds": ev.holds, "value": ev.value,
                        "permitted": ev.permitted, "detail": ev.detail})
        return out

    def outcomes_of(self, kind: str | OutcomeKind, entity: str | None = None) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind
                and (entity is None or o.entity == entity)]
