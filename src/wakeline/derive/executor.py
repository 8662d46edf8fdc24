"""Run one derivation job and co-commit its effects (invariant 7).

``DeriveExecutor.execute(job)`` does, in order:

1. *claim*: upsert the job row as ``running`` (attempt n) unless it is already
   terminal — a redelivered finished job is answered ``duplicate`` and applies
   nothing;
2. *read*: the cursor and the entity's driving-source rows (a short read);
3. *call* the derivation function outside any transaction, with its timeout;
4. *commit*, in ONE transaction: the emitted records (keyed upserts, retractions
   as tombstones, events), the watermark advance, the run row (sorted
   trigger_reasons, definition hashes) and the job's terminal state.  The
   cursor row is locked and checked against the watermark read in step 2, and
   ``runs (job_id, attempt)`` is unique, so a redelivered job cannot apply twice.

Failures are classified (:func:`wakeline.derive.errors.classify`): transient ones
return ``retry_in`` (exponential backoff) until the attempt budget is spent;
permanent, config and timeout failures are not retried.  A job that ends without
success is ``dead`` and says so in its run row, its job row and its cursor row
(``last_outcome``), which is how the stream learns the mailbox is free again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from wakeline.catalog import Catalog, DerivationContext, validate_emissions
from wakeline.clock import Clock, SystemClock, iso
from wakeline.core.build import build_plan
from wakeline.core.inputs import definition_hashes, record_dict, select_input
from wakeline.core.plan import DerivationPlan, Plan, Rec
from wakeline.derive.errors import RunTimeout, backoff, classify
from wakeline.store.records import REC_COLUMNS, NewRecord, NoLiveHead, Store, row_to_rec

TERMINAL = ("succeeded", "noop", "dead")


@dataclass(frozen=True)
class JobSpec:
    """A job as it travels on the derive topic."""

    job_id: str
    workspace: str
    derivation: str
    entity: str
    reasons: tuple[str, ...] = ()
    run_after: float | None = None
    attempt: int = 1
    dedupe: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> JobSpec:
        d = json.loads(raw)
        return cls(d["job_id"], d["workspace"], d["derivation"], d["entity"],
                   tuple(d.get("reasons", ())), d.get("run_after"), int(d.get("attempt", 1)),
                   tuple(d.get("dedupe", ())))


@dataclass
class RunResult:
    job_id: str
    attempt: int
    outcome: str  # succeeded | noop | failed | dead | duplicate
    run_id: int | None = None
    watermark_before: int = 0
    watermark_after: int = 0
    records_consumed: int = 0
    error: str | None = None
    error_kind: str | None = None
    retry_in: float | None = None
    emitted: list[int] = field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    reasons: tuple[str, ...] = ()


class DeriveExecutor:
    """Executes jobs against one PostgreSQL database.  Not thread-safe: one per worker."""

    def __init__(self, catalog: Catalog, dsn: str, *, clock: Clock | None = None,
                 max_attempts: int = 3, backoff_base: float = 2.0,
                 plan: Plan | None = None,
                 fail: Callable[[JobSpec], BaseException | None] | None = None) -> None:
        self.catalog = catalog
        self.plan = plan or build_plan(catalog)
        self.dsn = dsn
        self.clock = clock or SystemClock()
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.fail = fail
        self.conn = psycopg.connect(dsn, autocommit=True)
        self._functions: dict[str, Callable[..., Any]] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="derive")
        self._trigger_hashes = {n: t.hash for n, t in self.plan.triggers.items()}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.conn.close()

    def reset(self) -> None:
        """Reconnect after an infrastructure failure (a broken or aborted connection)."""
        try:
            self.conn.close()
        finally:
            self.conn = psycopg.connect(self.dsn, autocommit=True)

    # -- the job --------------------------------------------------------------------

    def execute(self, job: JobSpec) -> RunResult:
        result = self._execute(job)
        result.reasons = tuple(sorted(job.reasons))
        return result

    def _execute(self, job: JobSpec) -> RunResult:
        d = self.plan.derivations[job.derivation]
        started = self.clock.now()
        if not self._claim(job, started):
            return RunResult(job.job_id, job.attempt, "duplicate", started_at=started)
        watermark, rows = self._read(job, d)
        inp = select_input(d, rows, watermark)
        noop = inp.is_empty() and not d.allow_empty
        emissions: list[dict[str, Any]] = []
        error: BaseException | None = self.fail(job) if self.fail else None
        if error is None and not noop:
            try:
                emissions = self._call(job, d, [record_dict(r) for r in inp.seen], started)
            except Exception as exc:  # the function's own failure is a run outcome
                error = exc
        finished = self.clock.now()
        if error is not None:
            return self._fail(job, d, watermark, started, finished, error)
        return self._commit(job, d, watermark, inp.watermark_after, len(inp.consumed),
                            emissions, "noop" if noop else "succeeded", started, finished)

    def _claim(self, job: JobSpec, now: datetime) -> bool:
        row = self.conn.execute(
            "INSERT INTO jobs (job_id, workspace, derivation, entity, state, reasons, run_after,"
            " attempts, dedupe_key, created_at, updated_at) VALUES (%s,%s,%s,%s,'running',%s,%s,"
            "%s,%s,%s,%s) ON CONFLICT (job_id) DO UPDATE SET state = 'running', "
            "attempts = EXCLUDED.attempts, updated_at = EXCLUDED.updated_at "
            "WHERE jobs.state NOT IN ('succeeded', 'noop', 'dead') "
            "AND jobs.attempts <= EXCLUDED.attempts RETURNING job_id",
            (job.job_id, job.workspace, job.derivation, job.entity, sorted(job.reasons),
             datetime.fromtimestamp(job.run_after, UTC) if job.run_after else None,
             job.attempt, job.dedupe[0] if job.dedupe else None, now, now),
        ).fetchone()
        return row is not None

    def _read(self, job: JobSpec, d: DerivationPlan) -> tuple[int, list[Rec]]:
        cur = self.conn.execute(
            "SELECT watermark FROM derivation_cursors WHERE workspace = %s AND derivation = %s "
            "AND entity = %s", (job.workspace, job.derivation, job.entity)).fetchone()
        watermark = int(cur[0]) if cur else 0
        names = sorted({n for n, _ in d.source.collections})
        since = watermark if d.mode == "changes" else 0
        with self.conn.cursor(row_factory=dict_row) as c:
            rows = c.execute(
                f"SELECT {REC_COLUMNS} FROM records WHERE workspace = %s AND entity = %s "
                "AND collection = ANY(%s) AND seq > %s ORDER BY seq",
                (job.workspace, job.entity, names, since)).fetchall()
        return watermark, [row_to_rec(r) for r in rows]

    def _function(self, d: DerivationPlan) -> Callable[..., Any]:
        fn = self._functions.get(d.name)
        if fn is None:
            fn = self._functions[d.name] = self.catalog.load_function(d.name)
        return fn

    def _call(self, job: JobSpec, d: DerivationPlan, records: list[dict[str, Any]],
              now: datetime) -> list[dict[str, Any]]:
        fn = self._function(d)
        ctx = DerivationContext(entity=job.entity, derivation=d.name, now=now, records=records,
                                workspace=job.workspace, reasons=tuple(sorted(job.reasons)))
        future = self._pool.submit(fn, ctx)
        try:
            result = future.result(timeout=d.timeout_s)
        except FutureTimeout:
            # Python cannot kill the thread; a fresh pool keeps the worker going.
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="derive")
            raise RunTimeout(f"derivation {d.name} exceeded timeout_s={d.timeout_s:g}",
                             derivation=d.name) from None
        return validate_emissions(self.catalog, d.name, result)

    # -- commit ---------------------------------------------------------------------------

    def _commit(self, job: JobSpec, d: DerivationPlan, watermark: int, after: int,
                consumed: int, emissions: list[dict[str, Any]], outcome: str,
                started: datetime, finished: datetime) -> RunResult:
        result = RunResult(job.job_id, job.attempt, outcome, watermark_before=watermark,
                           watermark_after=after, records_consumed=consumed,
                           started_at=started, finished_at=finished)
        try:
            with self.conn.transaction():
                current = self._lock_cursor(job)
                if current != watermark:
                    # Another run of this mailbox moved the cursor since we read it:
                    # re-read and re-run rather than apply over it.
                    raise _Conflict(current)
                run_id = self._insert_run(job, d, result, None, None)
                result.run_id = run_id
                store = Store(self.conn, _FixedClock(finished))
                for em in emissions:
                    seq = self._emit(store, job, em, run_id)
                    if seq is not None:
                        result.emitted.append(seq)
                self.conn.execute(
                    "UPDATE derivation_cursors SET watermark = %s, last_run_at = %s, "
                    "last_success_at = %s, at_handled_through = %s, last_run_id = %s, "
                    "advance_count = advance_count + 1, last_outcome = %s, last_job_id = %s, "
                    "updated_at = %s WHERE workspace = %s AND derivation = %s AND entity = %s",
                    (after, finished, finished, finished, run_id, outcome, job.job_id, finished,
                     job.workspace, job.derivation, job.entity))
                self._finish_job(job, outcome, None, None, finished)
        except psycopg.errors.UniqueViolation:
            return RunResult(job.job_id, job.attempt, "duplicate", started_at=started)
        except _Conflict:
            return self._fail(job, d, watermark, started, finished,
                              RuntimeError("cursor moved during the run"), kind="transient")
        return result

    def _lock_cursor(self, job: JobSpec) -> int:
        self.conn.execute(
            "INSERT INTO derivation_cursors (workspace, derivation, entity) VALUES (%s,%s,%s) "
            "ON CONFLICT DO NOTHING", (job.workspace, job.derivation, job.entity))
        row = self.conn.execute(
            "SELECT watermark FROM derivation_cursors WHERE workspace = %s AND derivation = %s "
            "AND entity = %s FOR UPDATE", (job.workspace, job.derivation, job.entity)).fetchone()
        assert row is not None
        return int(row[0])

    def _insert_run(self, job: JobSpec, d: DerivationPlan, r: RunResult, error: str | None,
                    kind: str | None) -> int:
        row = self.conn.execute(
            "INSERT INTO runs (job_id, attempt, workspace, derivation, entity, trigger_reasons, "
            "definition_hashes, outcome, started_at, finished_at, watermark_before, "
            "watermark_after, records_consumed, error, error_kind) VALUES "
            "(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) RETURNING run_id",
            (job.job_id, job.attempt, job.workspace, job.derivation, job.entity,
             sorted(job.reasons),
             Jsonb(definition_hashes(self.plan.catalog_hash, d, self._trigger_hashes,
                                     job.reasons)),
             r.outcome, r.started_at, r.finished_at, r.watermark_before, r.watermark_after,
             r.records_consumed, error, kind)).fetchone()
        assert row is not None
        return int(row[0])

    def _finish_job(self, job: JobSpec, state: str, error: str | None, kind: str | None,
                    now: datetime) -> None:
        self.conn.execute(
            "UPDATE jobs SET state = %s, last_error = %s, error_kind = %s, updated_at = %s "
            "WHERE job_id = %s", (state, error, kind, now, job.job_id))

    def _emit(self, store: Store, job: JobSpec, em: Mapping[str, Any], run_id: int) -> int | None:
        coll = self.catalog.collections[em["collection"]]
        version = coll.active_version
        if em.get("retract"):
            try:
                return store.retract(job.workspace, job.entity, coll.name, em["key"],
                                     collection_version=version, produced_by_run=run_id)
            except NoLiveHead:
                return None  # retracting an absent value is already true
        # Emitted rows need enrichment only when their collection declares it.
        needs = bool(coll.scorers) or any(a.required for a in coll.annotators.values())
        return store.insert_record(NewRecord(
            workspace=job.workspace, entity=job.entity, collection=coll.name,
            collection_version=version, type=em.get("type", ""), key=em.get("key"),
            content=em.get("content") or {}, text=em.get("text", ""), ready=not needs,
            produced_by_run=run_id))

    # -- failure ----------------------------------------------------------------------------

    def _fail(self, job: JobSpec, d: DerivationPlan, watermark: int, started: datetime,
              finished: datetime, error: BaseException, kind: str | None = None) -> RunResult:
        kind = kind or classify(error)
        final = kind != "transient" or job.attempt >= self.max_attempts
        outcome = "dead" if final else "failed"
        result = RunResult(job.job_id, job.attempt, outcome, watermark_before=watermark,
                           watermark_after=watermark, error=f"{type(error).__name__}: {error}",
                           error_kind=kind, started_at=started, finished_at=finished)
        try:
            with self.conn.transaction():
                result.run_id = self._insert_run(job, d, result, result.error, kind)
                self._finish_job(job, "dead" if final else "retrying", result.error, kind,
                                 finished)
                if final:
                    self._lock_cursor(job)
                    self.conn.execute(
                        "UPDATE derivation_cursors SET last_run_at = %s, last_run_id = %s, "
                        "last_outcome = 'dead', last_job_id = %s, updated_at = %s "
                        "WHERE workspace = %s AND derivation = %s AND entity = %s",
                        (finished, result.run_id, job.job_id, finished, job.workspace,
                         job.derivation, job.entity))
        except psycopg.errors.UniqueViolation:
            return RunResult(job.job_id, job.attempt, "duplicate", started_at=started)
        if not final:
            result.retry_in = backoff(job.attempt, self.backoff_base)
        return result

    def describe(self, result: RunResult) -> str:
        return (f"{result.job_id} attempt {result.attempt}: {result.outcome} "
                f"(watermark {result.watermark_before}→{result.watermark_after}, "
                f"{result.records_consumed} consumed, finished {iso(result.finished_at)})")


class _Conflict(Exception):
    def __init__(self, current: int) -> None:
        super().__init__(f"cursor is at {current}")
        self.current = current


class _FixedClock:
    """The run's commit instant, so every emitted row carries the same created_at."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at
