"""Run one derivation job and co-commit its effects (invariant 7).

``DeriveExecutor.execute(job)`` does, in order:

1. *claim*: upsert the job row as ``running`` (attempt n) unless it is already
   terminal — a redelivered finished job is answered ``duplicate`` and applies
   nothing;
2. *read*: the cursor and the entity's driving-source rows (a short read, in the
   same round trip as the claim);
3. *call* the derivation function outside any transaction, with its timeout;
4. *commit*, in ONE transaction: the emitted records (keyed upserts, retractions
   as tombstones, events), the watermark advance, the run row (sorted
   trigger_reasons, definition hashes) and the job's terminal state.  The
   cursor row is locked and checked against the watermark read in step 2, and
   ``runs (job_id, attempt)`` is unique, so a redelivered job cannot apply twice.
   It is one round trip: prepared statements sent as one query, the check done
   in SQL (see ``DeriveExecutor._commit``).

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
from wakeline.store.records import REC_COLUMNS, row_to_rec

TERMINAL = ("succeeded", "noop", "dead")

# The statements of a job's two round trips, prepared once per connection (named
# server-side prepared statements, see DeriveExecutor._connect) and sent as one
# multi-statement query of EXECUTEs per round trip: one parse, no planning, one
# network round trip, one implicit transaction.  name -> (parameter types, SQL).
_STATEMENTS: dict[str, tuple[str, str]] = {
    # -- claim and read ---------------------------------------------------------------
    "wl_claim": (
        "text, text, text, text, text[], timestamptz, integer, text, timestamptz",
        "INSERT INTO jobs (job_id, workspace, derivation, entity, state, reasons, run_after, "
        "attempts, dedupe_key, created_at, updated_at) VALUES ($1,$2,$3,$4,'running',$5,$6,"
        "$7,$8,$9,$9) ON CONFLICT (job_id) DO UPDATE SET state = 'running', "
        "attempts = EXCLUDED.attempts, updated_at = EXCLUDED.updated_at "
        "WHERE jobs.state NOT IN ('succeeded', 'noop', 'dead') "
        "AND jobs.attempts <= EXCLUDED.attempts RETURNING job_id"),
    "wl_cursor": (
        "text, text, text",
        "SELECT watermark FROM derivation_cursors WHERE workspace = $1 AND derivation = $2 "
        "AND entity = $3"),
    "wl_records": (
        "text, text, text[]",
        f"SELECT {REC_COLUMNS} FROM records WHERE workspace = $1 AND entity = $2 "
        "AND collection = ANY($3) ORDER BY seq"),
    # ``changes`` mode: only the rows above the cursor's watermark.
    "wl_records_since": (
        "text, text, text[], text",
        f"SELECT {REC_COLUMNS} FROM records WHERE workspace = $1 AND entity = $2 "
        "AND collection = ANY($3) AND seq > COALESCE((SELECT watermark FROM "
        "derivation_cursors WHERE workspace = $1 AND derivation = $4 AND entity = $2), 0) "
        "ORDER BY seq"),
    # -- commit (see DeriveExecutor._commit).  "The run row" is runs (job_id, attempt):
    # it exists in the transaction only if the guard held. ------------------------------
    "wl_ensure_cursor": (
        "text, text, text",
        "INSERT INTO derivation_cursors (workspace, derivation, entity) VALUES ($1,$2,$3) "
        "ON CONFLICT DO NOTHING"),
    "wl_lock_cursor": (
        "text, text, text",
        "SELECT watermark FROM derivation_cursors WHERE workspace = $1 AND derivation = $2 "
        "AND entity = $3 FOR UPDATE"),
    "wl_insert_run": (
        "text, integer, text, text, text, text[], jsonb, text, timestamptz, timestamptz, "
        "bigint, bigint, integer",
        "INSERT INTO runs (job_id, attempt, workspace, derivation, entity, trigger_reasons, "
        "definition_hashes, outcome, started_at, finished_at, watermark_before, "
        "watermark_after, records_consumed) SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13 "
        "FROM derivation_cursors c WHERE c.workspace = $3 AND c.derivation = $4 "
        "AND c.entity = $5 AND c.watermark = $11 RETURNING run_id"),
    "wl_emit": (
        "text, text, text, integer, text, text, jsonb, text, timestamptz, timestamptz, text, "
        "integer",
        "INSERT INTO records (workspace, entity, collection, collection_version, type, key, "
        "content, text, enriched_at, created_at, produced_by_run) SELECT $1,$2,$3,$4,$5,$6,"
        "$7,$8,$9,$10, r.run_id FROM runs r WHERE r.job_id = $11 AND r.attempt = $12 "
        "RETURNING seq"),
    # Store.retract's tombstone, in two statements: the slot's advisory lock (its own
    # statement, so the head read after it sees what the lock waited for), then a
    # tombstone for the live head naming it as parent.
    "wl_slot_lock": ("text", "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"),
    "wl_retract": (
        "integer, timestamptz, text, text, text, text, text, integer",
        "INSERT INTO records (workspace, entity, collection, collection_version, type, "
        "status, key, content, text, tombstone, parents, enriched_at, created_at, "
        "produced_by_run) SELECT h.workspace, h.entity, h.collection, $1, h.type, 'active', "
        "h.key, '{\"tombstone\": true}'::jsonb, '', true, ARRAY[h.seq], $2, $2, r.run_id "
        "FROM (SELECT * FROM records WHERE workspace = $3 AND entity = $4 "
        "AND collection = $5 AND key = $6 AND enriched_at IS NOT NULL AND status = 'active' "
        "ORDER BY seq DESC LIMIT 1) h, runs r "
        "WHERE r.job_id = $7 AND r.attempt = $8 AND NOT h.tombstone RETURNING seq"),
    "wl_finish_job": (
        "text, timestamptz, text, integer",
        "UPDATE jobs SET state = $1, last_error = NULL, error_kind = NULL, updated_at = $2 "
        "WHERE job_id = $3 AND EXISTS (SELECT 1 FROM runs r WHERE r.job_id = $3 "
        "AND r.attempt = $4)"),
    "wl_advance": (
        "bigint, timestamptz, text, text, integer, text, text, text",
        "UPDATE derivation_cursors c SET watermark = $1, last_run_at = $2, "
        "last_success_at = $2, at_handled_through = $2, last_run_id = r.run_id, "
        "advance_count = c.advance_count + 1, last_outcome = $3, last_job_id = $4, "
        "updated_at = $2 FROM runs r WHERE r.job_id = $4 AND r.attempt = $5 "
        "AND c.workspace = $6 AND c.derivation = $7 AND c.entity = $8"),
}
#: ``EXECUTE name(%s, ...)`` for each statement (parameters bound client-side).
_EXECUTE = {name: f"EXECUTE {name}({', '.join(['%s'] * len(types.split(',')))})"
            for name, (types, _) in _STATEMENTS.items()}


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
        self.conn = self._connect()
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
            self.conn = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        """An autocommit connection with the job statements prepared (once per session;
        they need a direct connection, not a transaction-pooling proxy)."""
        conn = psycopg.connect(self.dsn, autocommit=True)
        try:
            for name, (types, sql) in _STATEMENTS.items():
                conn.execute(f"PREPARE {name} ({types}) AS {sql}")
        except BaseException:
            conn.close()
            raise
        return conn

    # -- the job --------------------------------------------------------------------

    def execute(self, job: JobSpec) -> RunResult:
        result = self._execute(job)
        result.reasons = tuple(sorted(job.reasons))
        return result

    def _execute(self, job: JobSpec) -> RunResult:
        d = self.plan.derivations[job.derivation]
        started = self.clock.now()
        claimed, watermark, rows = self._claim_and_read(job, d, started)
        if not claimed:
            return RunResult(job.job_id, job.attempt, "duplicate", started_at=started)
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

    def _claim_and_read(self, job: JobSpec, d: DerivationPlan,
                        now: datetime) -> tuple[bool, int, list[Rec]]:
        """Claim the job and read its cursor and the entity's driving-source rows.

        One round trip: the three statements go out as one query (one implicit
        transaction, so the reads see the claim).  A job that is not claimed
        (already terminal, or a newer attempt holds it) reads for nothing, which
        is rare and cheaper than a second round trip on every job.
        """
        names = sorted({n for n, _ in d.source.collections})
        key = (job.workspace, job.derivation, job.entity)
        rows = self._run([
            ("wl_claim", (job.job_id, job.workspace, job.derivation, job.entity,
                          sorted(job.reasons),
                          datetime.fromtimestamp(job.run_after, UTC) if job.run_after else None,
                          job.attempt, job.dedupe[0] if job.dedupe else None, now)),
            ("wl_cursor", key),
            ("wl_records_since", (job.workspace, job.entity, names, job.derivation))
            if d.mode == "changes" else ("wl_records", (job.workspace, job.entity, names)),
        ], all_rows_of=2)
        claimed, cursor, records = rows
        watermark = int(cursor[0]["watermark"]) if cursor else 0
        return bool(claimed), watermark, [row_to_rec(r) for r in records]

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
        """Apply the run in one transaction and one round trip.

        The statements go out as one query (prepared, see ``_STATEMENTS``) and are
        guarded in SQL rather than by a check in between: the cursor row is locked
        first, the run row is inserted only if the locked watermark is still the
        one this run read, and every later write (emissions, job, cursor advance)
        joins on that run row, so a moved cursor writes nothing and the
        transaction commits empty.  The order of the changes (emissions before the
        cursor advance) is what CDC sees.
        """
        result = RunResult(job.job_id, job.attempt, outcome, watermark_before=watermark,
                           watermark_after=after, records_consumed=consumed,
                           started_at=started, finished_at=finished)
        key = (job.workspace, job.derivation, job.entity)
        run_key = (job.job_id, job.attempt)
        statements: list[tuple[str, tuple[Any, ...]]] = [
            ("wl_ensure_cursor", key),
            ("wl_lock_cursor", key),
            ("wl_insert_run", (
                job.job_id, job.attempt, job.workspace, job.derivation, job.entity,
                sorted(job.reasons),
                Jsonb(definition_hashes(self.plan.catalog_hash, d, self._trigger_hashes,
                                        job.reasons)),
                outcome, started, finished, watermark, after, consumed)),
        ]
        emitted: list[int] = []  # the index of the statement returning each emission's seq
        for em in emissions:
            statements.extend(self._emit(job, em, finished, run_key))
            emitted.append(len(statements) - 1)
        statements.append(("wl_finish_job", (outcome, finished) + run_key))
        statements.append(("wl_advance", (after, finished, outcome) + run_key + key))
        try:
            rows = self._run(statements)
        except psycopg.errors.UniqueViolation:
            return RunResult(job.job_id, job.attempt, "duplicate", started_at=started)
        locked, run_row = rows[1], rows[2]
        if not run_row:
            # Another run of this mailbox moved the cursor since we read it: nothing
            # was applied; re-read and re-run rather than apply over it.
            moved = (f"cursor moved during the run ({watermark} -> "
                     f"{locked[0]['watermark'] if locked else 0})")
            return self._fail(job, d, watermark, started, finished, RuntimeError(moved),
                              kind="transient")
        result.run_id = int(run_row[0]["run_id"])
        result.emitted = [int(rows[i][0]["seq"]) for i in emitted if rows[i]]
        return result

    def _run(self, statements: list[tuple[str, tuple[Any, ...]]],
             all_rows_of: int | None = None) -> list[list[dict[str, Any]]]:
        """Execute prepared ``statements`` as ONE query: one round trip, one implicit
        transaction (the connection is in autocommit, so a failing statement rolls
        back them all).  Returns each statement's rows: the first one only (or
        none), except for the statement at index ``all_rows_of``."""
        sql = "; ".join(_EXECUTE[name] for name, _ in statements)
        params = tuple(p for _, ps in statements for p in ps)
        out: list[list[dict[str, Any]]] = []
        with psycopg.ClientCursor(self.conn, row_factory=dict_row) as cur:
            cur.execute(sql, params)
            for i in range(len(statements)):
                if i:
                    cur.nextset()
                res = cur.pgresult
                if res is None or res.status != psycopg.pq.ExecStatus.TUPLES_OK:
                    out.append([])
                elif i == all_rows_of:
                    out.append(cur.fetchall())
                else:
                    row = cur.fetchone()
                    out.append([row] if row is not None else [])
        return out

    def _emit(self, job: JobSpec, em: Mapping[str, Any], now: datetime,
              run_key: tuple[str, int]) -> list[tuple[str, tuple[Any, ...]]]:
        """The statements writing one emission, produced by the run ``run_key`` names;
        the last one returns the new row's seq (or nothing)."""
        coll = self.catalog.collections[em["collection"]]
        version = coll.active_version
        if em.get("retract"):
            # Retracting an absent value is already true and writes nothing.
            slot = f"{job.workspace}\x1f{job.entity}\x1f{coll.name}\x1f{em['key']}"
            return [("wl_slot_lock", (slot,)),
                    ("wl_retract", (version, now, job.workspace, job.entity, coll.name,
                                    em["key"]) + run_key)]
        # Emitted rows need enrichment only when their collection declares it.
        needs = bool(coll.scorers) or any(a.required for a in coll.annotators.values())
        return [("wl_emit", (job.workspace, job.entity, coll.name, version, em.get("type", ""),
                             em.get("key"), Jsonb(dict(em.get("content") or {})),
                             em.get("text", ""), None if needs else now, now) + run_key)]

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
