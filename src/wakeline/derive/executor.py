"""Run derivation jobs and co-commit their effects (invariant 7).

``DeriveExecutor.execute_batch(jobs)`` runs several jobs with a constant number of
round trips; ``DeriveExecutor.execute(job)`` is a batch of one.  In order:

1. *claim and read* (one round trip): upsert every job row as ``running``
   (attempt n) unless it is already terminal — a redelivered finished job is
   answered ``duplicate`` and applies nothing — and read each job's cursor and
   its entity's driving-source rows;
2. *call* each claimed job's derivation function outside any transaction, with
   its timeout, one after the other on the derivation thread; its failure
   (exception, timeout, invalid emission) is that job's outcome only;
3. *commit* (one round trip, ONE transaction for the batch): the emitted records
   (keyed upserts, retractions as tombstones, events), the watermark advances,
   the run rows (sorted trigger_reasons, definition hashes), the jobs' terminal
   states, and for failed jobs their run rows and job states.  Each job's writes
   are guarded per job, in SQL: the cursor rows are locked first, a run row is
   inserted only if the locked watermark is still the one the job read, and every
   later write joins on that job's run row, so a job whose cursor moved writes
   nothing while the others apply; ``runs (job_id, attempt)`` is unique, so a
   redelivered job cannot apply twice.  Should a statement fail (a redelivered
   job racing its first delivery, a deadlock, a value PostgreSQL rejects) the
   batch's transaction applied nothing, and each job is committed again alone:
   the failure stays with the job that caused it.

Jobs of one mailbox (or twice the same job) in a batch run in successive waves,
in order, never in one statement.

Failures are classified (:func:`wakeline.derive.errors.classify`): transient ones
return ``retry_in`` (exponential backoff) until the attempt budget is spent;
permanent, config and timeout failures are not retried.  A job that ends without
success is ``dead`` and says so in its run row, its job row and its cursor row
(``last_outcome``), which is how the stream learns the mailbox is free again.
A failure of the database or of the worker itself is not an outcome: the job's
slot in ``execute_batch``'s answer holds the exception (``execute`` raises it)
and nothing of that job was applied.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import orjson
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb, set_json_loads

from wakeline.catalog import Catalog, DerivationContext, validate_emissions
from wakeline.cdc._json import loads
from wakeline.clock import Clock, SystemClock, iso
from wakeline.core.build import build_plan
from wakeline.core.inputs import definition_hashes, record_dict, select_input
from wakeline.core.plan import DerivationPlan, Plan, Rec
from wakeline.derive.errors import RunTimeout, backoff, classify
from wakeline.store.records import REC_COLUMNS, row_to_rec

TERMINAL = ("succeeded", "noop", "dead")
_T = TypeVar("_T")

#: The columns of a job row and of an emission row in the batch statements' json
#: parameter (one JSON array of objects per batch; ``json``, not ``jsonb``: read
#: once, it costs less as text than as a sorted binary tree); each statement
#: declares the columns it reads (see ``_rows``).
_COLUMNS = {
    "i": "integer", "k": "integer", "job_id": "text", "attempt": "integer",
    "workspace": "text", "derivation": "text", "entity": "text", "reasons": "text[]",
    "hashes": "jsonb", "outcome": "text", "started": "timestamptz",
    "finished": "timestamptz", "watermark_before": "bigint", "watermark_after": "bigint",
    "consumed": "integer", "error": "text", "error_kind": "text", "guard": "boolean",
    "state": "text", "cursor": "text", "run_after": "timestamptz", "dedupe": "text",
    "now": "timestamptz", "collections": "text[]", "since": "boolean",
    "collection": "text", "version": "integer", "type": "text", "key": "text",
    "content": "jsonb", "text": "text", "enriched_at": "timestamptz",
    "created_at": "timestamptz",
}


def _rows(alias: str, *columns: str) -> str:
    return (f"json_to_recordset($1) AS {alias}("
            + ", ".join(f"{c} {_COLUMNS[c]}" for c in columns) + ")")


_MAILBOX = ("c.workspace = j.workspace AND c.derivation = j.derivation "
            "AND c.entity = j.entity")
#: The job's run row in this transaction, as a lateral join: one index probe per job
#: (the planner assumes 100 rows from json_to_recordset and would hash whole
#: tables otherwise).
_RUN_OF = ("JOIN LATERAL (SELECT r.run_id FROM runs r WHERE r.job_id = {0}.job_id "
           "AND r.attempt = {0}.attempt LIMIT 1) r ON true")

# The statements, prepared once per connection (named server-side prepared
# statements, see DeriveExecutor._connect) and sent as one multi-statement query of
# EXECUTEs per round trip: one parse, no planning, one network round trip, one
# implicit transaction.  The batch statements take the whole batch as one json
# parameter.  Every row they touch is found through a unique index, whatever the
# batch size: lateral probes, and upserts rather than UPDATE ... FROM (an existing
# row takes the DO UPDATE branch; the insert branch never runs, as the job and
# cursor rows exist by then).  name -> (parameter types, SQL).
_STATEMENTS: dict[str, tuple[str, str]] = {
    # -- claim and read: claim each job unless it is terminal (or a newer attempt
    # holds it), and read its cursor and its entity's driving-source rows
    # (``since``: only the rows above the watermark, the ``changes`` mode). --------
    "wl_claim_read": (
        "json",
        "WITH j AS MATERIALIZED (SELECT * FROM "
        + _rows("j", "i", "job_id", "workspace", "derivation", "entity", "reasons",
                "run_after", "attempt", "dedupe", "now", "collections", "since")
        + "), claim AS (INSERT INTO jobs (job_id, workspace, derivation, entity, state, "
        "reasons, run_after, attempts, dedupe_key, created_at, updated_at) SELECT "
        "j.job_id, j.workspace, j.derivation, j.entity, 'running', j.reasons, j.run_after, "
        "j.attempt, j.dedupe, j.now, j.now FROM j ORDER BY j.job_id "
        "ON CONFLICT (job_id) DO UPDATE SET state = 'running', "
        "attempts = EXCLUDED.attempts, updated_at = EXCLUDED.updated_at "
        "WHERE jobs.state NOT IN ('succeeded', 'noop', 'dead') "
        "AND jobs.attempts <= EXCLUDED.attempts RETURNING job_id) "
        "SELECT j.i, claim.job_id IS NOT NULL AS claimed, c.watermark, r.* FROM j "
        "LEFT JOIN claim ON claim.job_id = j.job_id "
        "LEFT JOIN LATERAL (SELECT c.watermark FROM derivation_cursors c WHERE "
        f"{_MAILBOX} LIMIT 1) c ON true LEFT JOIN LATERAL (SELECT {REC_COLUMNS} "
        "FROM records WHERE workspace = j.workspace AND entity = j.entity "
        "AND collection = ANY(j.collections) "
        "AND seq > CASE WHEN j.since THEN COALESCE(c.watermark, 0) ELSE 0 END "
        "ORDER BY seq) r ON true ORDER BY j.i, r.seq"),
    # -- commit (see DeriveExecutor._commit).  "A job's run row" is runs (job_id,
    # attempt): it exists in the transaction only if the job's guard held. ------------
    # The cursor rows the batch writes, created if missing and locked, in key order
    # (two batches sharing cursors cannot deadlock on them): an upsert's DO UPDATE
    # branch locks the row it finds even when its WHERE leaves it unchanged.
    "wl_lock_cursors": (
        "json",
        "INSERT INTO derivation_cursors AS c (workspace, derivation, entity) "
        "SELECT DISTINCT j.workspace, j.derivation, j.entity FROM "
        + _rows("j", "workspace", "derivation", "entity", "cursor")
        + " WHERE j.cursor IS NOT NULL ORDER BY 1, 2, 3 "
        "ON CONFLICT (workspace, derivation, entity) DO UPDATE "
        "SET watermark = c.watermark WHERE false"),
    # A success's run row only if its locked watermark is the one the job read, a
    # failure's unconditionally; the job's state only where its run row was written.
    # Answers every job: its run row (or none) and its cursor's watermark.
    "wl_insert_runs": (
        "json",
        "WITH j AS MATERIALIZED (SELECT j.*, (SELECT c.watermark FROM derivation_cursors c "
        f"WHERE {_MAILBOX}) AS locked FROM "
        + _rows("j", "i", "job_id", "attempt", "workspace", "derivation", "entity",
                "reasons", "hashes", "outcome", "started", "finished", "watermark_before",
                "watermark_after", "consumed", "error", "error_kind", "guard", "state")
        + "), run AS (INSERT INTO runs (job_id, attempt, workspace, derivation, entity, "
        "trigger_reasons, definition_hashes, outcome, started_at, finished_at, "
        "watermark_before, watermark_after, records_consumed, error, error_kind) "
        "SELECT j.job_id, j.attempt, j.workspace, j.derivation, j.entity, j.reasons, "
        "j.hashes, j.outcome, j.started, j.finished, j.watermark_before, j.watermark_after, "
        "j.consumed, j.error, j.error_kind FROM j "
        "WHERE NOT j.guard OR j.locked = j.watermark_before ORDER BY j.i "
        "RETURNING run_id, job_id, attempt), "
        "job AS (INSERT INTO jobs (job_id, workspace, derivation, entity, state, last_error, "
        "error_kind, updated_at) SELECT j.job_id, j.workspace, j.derivation, j.entity, "
        "j.state, j.error, j.error_kind, j.finished FROM j JOIN run "
        "ON run.job_id = j.job_id AND run.attempt = j.attempt ORDER BY j.job_id "
        "ON CONFLICT (job_id) DO UPDATE SET state = EXCLUDED.state, "
        "last_error = EXCLUDED.last_error, error_kind = EXCLUDED.error_kind, "
        "updated_at = EXCLUDED.updated_at) "
        "SELECT j.i, j.locked, run.run_id FROM j LEFT JOIN run "
        "ON run.job_id = j.job_id AND run.attempt = j.attempt"),
    "wl_emit_rows": (
        "json",
        "INSERT INTO records (workspace, entity, collection, collection_version, type, key, "
        "content, text, enriched_at, created_at, produced_by_run) SELECT e.workspace, "
        "e.entity, e.collection, e.version, e.type, e.key, e.content, e.text, e.enriched_at, "
        "e.created_at, r.run_id FROM "
        + _rows("e", "i", "k", "job_id", "attempt", "workspace", "entity", "collection",
                "version", "type", "key", "content", "text", "enriched_at", "created_at")
        + " " + _RUN_OF.format("e") + " ORDER BY e.i, e.k RETURNING seq, produced_by_run"),
    # One emission of a job that also retracts (its emissions go one by one, in order).
    "wl_emit": (
        "text, text, text, integer, text, text, jsonb, text, timestamptz, timestamptz, text, "
        "integer",
        "INSERT INTO records (workspace, entity, collection, collection_version, type, key, "
        "content, text, enriched_at, created_at, produced_by_run) SELECT $1,$2,$3,$4,$5,$6,"
        "$7,$8,$9,$10, r.run_id FROM runs r WHERE r.job_id = $11 AND r.attempt = $12 "
        "RETURNING seq, produced_by_run"),
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
        "WHERE r.job_id = $7 AND r.attempt = $8 AND NOT h.tombstone "
        "RETURNING seq, produced_by_run"),
    # A success advances the watermark and the success columns; a dead run only
    # records how the last run ended (either way the stream learns the mailbox is
    # free from this row's change).
    "wl_update_cursors": (
        "json",
        "INSERT INTO derivation_cursors AS c (workspace, derivation, entity, watermark, "
        "last_run_at, last_success_at, at_handled_through, last_run_id, advance_count, "
        "last_outcome, last_job_id, updated_at) SELECT j.workspace, j.derivation, j.entity, "
        "j.watermark_after, j.finished, j.finished, j.finished, r.run_id, 1, j.outcome, "
        "j.job_id, j.finished FROM "
        + _rows("j", "job_id", "attempt", "workspace", "derivation", "entity",
                "watermark_after", "finished", "outcome", "cursor")
        + " " + _RUN_OF.format("j") + " WHERE j.cursor IS NOT NULL ORDER BY 1, 2, 3 "
        "ON CONFLICT (workspace, derivation, entity) DO UPDATE SET "
        "watermark = CASE WHEN EXCLUDED.last_outcome = 'dead' THEN c.watermark "
        "ELSE EXCLUDED.watermark END, last_run_at = EXCLUDED.last_run_at, "
        "last_success_at = CASE WHEN EXCLUDED.last_outcome = 'dead' THEN c.last_success_at "
        "ELSE EXCLUDED.last_success_at END, "
        "at_handled_through = CASE WHEN EXCLUDED.last_outcome = 'dead' "
        "THEN c.at_handled_through ELSE EXCLUDED.at_handled_through END, "
        "last_run_id = EXCLUDED.last_run_id, advance_count = c.advance_count "
        "+ CASE WHEN EXCLUDED.last_outcome = 'dead' THEN 0 ELSE 1 END, "
        "last_outcome = EXCLUDED.last_outcome, last_job_id = EXCLUDED.last_job_id, "
        "updated_at = EXCLUDED.updated_at"),
}
#: ``EXECUTE name(%s, ...)`` for each statement (parameters bound client-side).
_EXECUTE = {name: f"EXECUTE {name}({', '.join(['%s'] * len(types.split(',')))})"
            for name, (types, _) in _STATEMENTS.items()}


#: The statements whose rows are emitted records (seq, produced_by_run).
_EMITTING = frozenset({"wl_emit_rows", "wl_emit", "wl_retract"})


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _loads(data: Any) -> Any:
    """A jsonb value read on the executor's connection: records' content,
    annotations and scores (``{}`` for most), without json.loads' encoding
    detection on bytes."""
    raw = bytes(data)
    return {} if raw == b"{}" else json.loads(raw.decode())


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
        # orjson over an explicit dict: dataclasses.asdict deep-copies field by field
        # and json.dumps is Python code; together they were 6 % of a conditions
        # worker's samples at 5k jobs/s (py-spy); 17 -> 0.5 us per job.
        return orjson.dumps({
            "job_id": self.job_id, "workspace": self.workspace,
            "derivation": self.derivation, "entity": self.entity,
            "reasons": self.reasons, "run_after": self.run_after,
            "attempt": self.attempt, "dedupe": self.dedupe})

    @classmethod
    def from_json(cls, raw: bytes | str) -> JobSpec:
        d = loads(raw)
        return cls(d["job_id"], d["workspace"], d["derivation"], d["entity"],
                   tuple(d.get("reasons", ())), d.get("run_after"), int(d.get("attempt", 1)),
                   tuple(d.get("dedupe", ())))

    @property
    def mailbox(self) -> tuple[str, str, str]:
        return (self.workspace, self.derivation, self.entity)


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


#: What ``execute_batch`` answers for one job: its result, or the infrastructure
#: failure (database, worker) that kept it from being applied.
Answer = RunResult | Exception


@dataclass
class _Run:
    """One job between its claim and its commit: what it read, what it will write."""

    job: JobSpec
    d: DerivationPlan
    started: datetime
    watermark: int
    rows: list[Rec]  # the entity's driving-source rows, as read
    finished: datetime | None = None
    outcome: str = ""  # succeeded | noop, or failed | dead
    after: int = 0
    consumed: int = 0
    emissions: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    kind: str | None = None  # set: a failure
    final: bool = False  # a failure that ends the job


@dataclass(frozen=True)
class _Call:
    """A derivation function to call for one job."""

    fn: Callable[..., Any]
    ctx: DerivationContext
    name: str
    timeout: float


@dataclass(frozen=True)
class _Raised:
    """What a derivation function raised (as opposed to returned)."""

    exc: BaseException


_PENDING = object()


def _filled(answers: list[_T | None]) -> list[_T]:
    """``answers`` once every slot is set."""
    assert all(a is not None for a in answers)
    return cast(list[_T], answers)


def waves(jobs: Sequence[JobSpec]) -> list[list[int]]:
    """Indexes of ``jobs`` in waves: no wave holds two jobs of one mailbox (or one job
    twice), and a mailbox's jobs are in successive waves in their order."""
    out: list[list[int]] = []
    seen: list[set[Any]] = []
    for i, job in enumerate(jobs):
        keys = (job.mailbox, job.job_id)
        for w, s in enumerate(seen):
            if keys[0] not in s and keys[1] not in s:
                break
        else:
            w = len(out)
            out.append([])
            seen.append(set())
        out[w].append(i)
        seen[w].update(keys)
    return out


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
        self._hashes: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}
        self._sources: dict[str, list[str]] = {}

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
        they need a direct connection, not a transaction-pooling proxy).

        Every row the statements touch is found by key, so the session plans no
        sequential scans: a prepared statement's generic plan is made once, and
        made while ``runs`` or ``derivation_cursors`` looked empty (a new database,
        stale statistics) it would scan the whole table per job long after it grew."""
        conn = psycopg.connect(self.dsn, autocommit=True)
        set_json_loads(_loads, conn)
        try:
            conn.execute("SET enable_seqscan = off")
            for name, (types, sql) in _STATEMENTS.items():
                conn.execute(f"PREPARE {name} ({types}) AS {sql}")
        except BaseException:
            conn.close()
            raise
        return conn

    # -- the jobs ---------------------------------------------------------------------

    def execute(self, job: JobSpec) -> RunResult:
        """Run one job; an infrastructure failure is raised (nothing was applied)."""
        [answer] = self.execute_batch([job])
        if isinstance(answer, Exception):
            raise answer
        return answer

    def execute_batch(self, jobs: Sequence[JobSpec]) -> list[Answer]:
        """Run ``jobs``; one answer per job, in order.

        A lost connection raises (the caller reconnects and runs the batch again:
        what committed is answered ``duplicate`` then).  Any other failure of the
        database or the worker is the answer of the job it concerns; the other jobs
        are applied."""
        answers: list[Answer | None] = [None] * len(jobs)
        for wave in waves(jobs):
            for i, answer in zip(wave, self._execute_wave([jobs[i] for i in wave]),
                                 strict=True):
                answers[i] = answer
        for job, answer in zip(jobs, answers, strict=True):
            if isinstance(answer, RunResult):
                answer.reasons = tuple(sorted(job.reasons))
        return _filled(answers)

    def _execute_wave(self, jobs: list[JobSpec]) -> list[Answer]:
        answers: list[Answer | None] = [None] * len(jobs)
        runs: dict[int, _Run] = {}
        calls: dict[int, _Call] = {}
        for i, claimed in enumerate(self._claim_and_read(jobs)):
            if not isinstance(claimed, _Run):
                answers[i] = claimed
                continue
            try:
                call = self._prepare(claimed)
            except Exception as exc:  # the worker's own failure, not the function's
                answers[i] = exc
                continue
            runs[i] = claimed
            if call is not None:
                calls[i] = call
        for i, (result, ended) in zip(calls, self._call_all(list(calls.values())),
                                      strict=True):
            try:
                self._called(runs[i], result, ended)
            except Exception as exc:  # the worker's own failure, not the function's
                answers[i] = exc
                del runs[i]
        for i, answer in self._commit(runs).items():
            answers[i] = answer
        return _filled(answers)

    def _claim_and_read(self, jobs: list[JobSpec]) -> list[_Run | Answer]:
        """Claim the jobs and read their cursors and entities' driving-source rows.

        One statement, one round trip.  A job that is not claimed (already
        terminal, or a newer attempt holds it) is answered ``duplicate``; it read
        for nothing, which is rare and cheaper than a round trip more.  Should the
        claim fail (a second running job of a mailbox), each job is claimed alone."""
        now = self.clock.now()
        at = now.isoformat()
        out: list[_Run | Answer | None] = [None] * len(jobs)
        rows: dict[int, str] = {}
        for i, job in enumerate(jobs):
            try:
                d = self.plan.derivations[job.derivation]
                rows[i] = _dumps({
                    "i": i, "job_id": job.job_id, "workspace": job.workspace,
                    "derivation": job.derivation, "entity": job.entity,
                    "reasons": sorted(job.reasons),
                    "run_after": datetime.fromtimestamp(job.run_after, UTC).isoformat()
                    if job.run_after else None,
                    "attempt": job.attempt, "dedupe": job.dedupe[0] if job.dedupe else None,
                    "now": at, "collections": self._collections(d),
                    "since": d.mode == "changes"})
            except Exception as exc:  # e.g. a derivation this catalog does not have
                out[i] = exc
        try:
            [read] = (self._run([("wl_claim_read", ("[" + ",".join(rows.values()) + "]",))])
                      if rows else [[]])
        except psycopg.Error as exc:
            if self._broken():
                raise
            if len(rows) == 1:
                [i] = rows
                out[i] = exc
            else:
                for i in rows:
                    out[i] = self._claim_and_read([jobs[i]])[0]
            return _filled(out)
        claimed: set[int] = set()
        watermarks: dict[int, int] = {}
        records: dict[int, list[Rec]] = {}
        for r in read:
            i = r["i"]
            if r["claimed"]:
                claimed.add(i)
            watermarks[i] = int(r["watermark"] or 0)
            if r["seq"] is not None:
                records.setdefault(i, []).append(row_to_rec(r))
        for i in rows:
            job = jobs[i]
            out[i] = (_Run(job, self.plan.derivations[job.derivation], now,
                           watermarks.get(i, 0), records.get(i, []))
                      if i in claimed else
                      RunResult(job.job_id, job.attempt, "duplicate", started_at=now))
        return _filled(out)

    def _collections(self, d: DerivationPlan) -> list[str]:
        names = self._sources.get(d.name)
        if names is None:
            names = self._sources[d.name] = sorted({n for n, _ in d.source.collections})
        return names

    def _prepare(self, run: _Run) -> _Call | None:
        """Select the job's input; the call of its function, or None when the run
        needs none (nothing pending: noop; failed before the call)."""
        job, d = run.job, run.d
        inp = select_input(d, run.rows, run.watermark)
        run.rows = []
        noop = inp.is_empty() and not d.allow_empty
        run.outcome = "noop" if noop else "succeeded"
        run.after, run.consumed = inp.watermark_after, len(inp.consumed)
        error: BaseException | None = self.fail(job) if self.fail else None
        if error is None and not noop:
            try:
                fn = self._function(d)
            except Exception as exc:  # unresolved: a config failure of the run
                error = exc
            else:
                ctx = DerivationContext(
                    entity=job.entity, derivation=d.name, now=run.started,
                    records=[record_dict(r) for r in inp.seen], workspace=job.workspace,
                    reasons=tuple(sorted(job.reasons)))
                return _Call(fn, ctx, d.name, d.timeout_s)
        run.finished = self.clock.now()
        if error is not None:
            self._failed(run, error)
        return None

    def _called(self, run: _Run, result: Any, ended: datetime) -> None:
        """What the job's function answered (by ``ended``), checked against the
        contract."""
        run.finished = ended
        if isinstance(result, _Raised):
            if not isinstance(result.exc, Exception):
                raise result.exc  # KeyboardInterrupt, SystemExit: not a run outcome
            self._failed(run, result.exc)  # the function's own failure is a run outcome
            return
        try:
            run.emissions = validate_emissions(self.catalog, run.d.name, result)
        except Exception as exc:
            self._failed(run, exc)

    def _failed(self, run: _Run, error: BaseException, kind: str | None = None) -> None:
        run.kind = kind or classify(error)
        run.final = run.kind != "transient" or run.job.attempt >= self.max_attempts
        run.outcome = "dead" if run.final else "failed"
        run.error = f"{type(error).__name__}: {error}"
        run.after, run.consumed, run.emissions = run.watermark, 0, []

    def _function(self, d: DerivationPlan) -> Callable[..., Any]:
        fn = self._functions.get(d.name)
        if fn is None:
            fn = self._functions[d.name] = self.catalog.load_function(d.name)
        return fn

    def _call_all(self, calls: list[_Call]) -> list[Any]:
        """Call the functions one after the other on the derivation thread, each within
        its own timeout (from its own start); for each, what it returned or
        :class:`_Raised`, and when it ended.  One hand-off to the thread per batch, not per job.  A
        call that runs out of time is answered ``RunTimeout`` and abandoned on its
        thread (Python cannot kill it); the calls after it go on a fresh one."""
        out: list[Any] = [_PENDING] * len(calls)
        start = 0
        while start < len(calls):
            start = self._call_from(calls, start, out)
        return out

    def _call_from(self, calls: list[_Call], start: int, out: list[Any]) -> int:
        """Run ``calls[start:]`` on the current thread; the index to go on from (all
        done: ``len(calls)``; after a timeout: the next one, on a fresh thread)."""
        lock = threading.Lock()
        running = [start, time.monotonic()]  # the call running, since when
        alive = [True]  # False: this thread was abandoned, its answers are not taken
        done = threading.Event()

        def work() -> None:
            for k in range(start, len(calls)):
                with lock:
                    if not alive[0]:
                        return
                    running[0], running[1] = k, time.monotonic()
                try:
                    result: Any = calls[k].fn(calls[k].ctx)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    result = _Raised(exc)
                ended = self.clock.now()
                with lock:
                    if not alive[0]:
                        return
                    out[k] = (result, ended)
            done.set()

        self._pool.submit(work)
        while True:
            with lock:
                k, since = running
            left = since + calls[k].timeout - time.monotonic()
            if done.wait(max(left, 0.0)):
                return len(calls)
            with lock:
                if running[0] != k or out[k] is not _PENDING:
                    continue  # it went on meanwhile
                if time.monotonic() - running[1] < calls[k].timeout:
                    continue
                alive[0] = False
                c = calls[k]
                out[k] = (_Raised(RunTimeout(
                    f"derivation {c.name} exceeded timeout_s={c.timeout:g}",
                    derivation=c.name)), self.clock.now())
            # A fresh thread keeps the worker going.
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="derive")
            return k + 1

    # -- commit ---------------------------------------------------------------------------

    def _commit(self, runs: Mapping[int, _Run]) -> dict[int, Answer]:
        """Apply ``runs`` in one transaction and one round trip, each guarded on its own.

        The statements go out as one query (prepared, see ``_STATEMENTS``), and the
        guard is in SQL rather than a check in between: the cursor rows are locked
        first (in key order), a success's run row is inserted only if its locked
        watermark is still the one the job read, and every later write (emissions,
        job, cursor advance) joins on the job's run row, so a job whose cursor moved
        writes nothing.  The order of the changes (emissions before the cursor
        advances) is what CDC sees.  A job whose cursor moved is failed (transient:
        re-read and re-run rather than apply over it) in a second transaction.

        A failing statement rolls the whole transaction back; then each job is
        committed alone, so the failure is the answer of the job that caused it
        (a unique violation on its run row: ``duplicate``)."""
        if not runs:
            return {}
        answers: dict[int, Answer] = {}
        built: dict[int, tuple[str, list[str], list[tuple[str, tuple[Any, ...]]]]] = {}
        for i, run in runs.items():
            try:
                built[i] = self._statements_of(i, run)
            except Exception as exc:  # e.g. an emission that cannot be serialized
                answers[i] = exc
        if not built:
            return answers
        job_rows = "[" + ",".join(b[0] for b in built.values()) + "]"
        emit_rows = [e for b in built.values() for e in b[1]]
        statements: list[tuple[str, tuple[Any, ...]]] = [
            ("wl_lock_cursors", (job_rows,)),
            ("wl_insert_runs", (job_rows,))]
        if emit_rows:
            statements.append(("wl_emit_rows", ("[" + ",".join(emit_rows) + "]",)))
        for b in built.values():
            statements.extend(b[2])
        statements.append(("wl_update_cursors", (job_rows,)))
        try:
            rows = self._run(statements)
        except psycopg.Error as exc:
            if self._broken():
                raise
            if len(built) > 1:
                for i in built:
                    answers.update(self._commit({i: runs[i]}))
                return answers
            [i] = built
            answers[i] = (RunResult(runs[i].job.job_id, runs[i].job.attempt, "duplicate",
                                    started_at=runs[i].started)
                          if isinstance(exc, psycopg.errors.UniqueViolation) else exc)
            return answers
        emitted: dict[int, list[int]] = {}
        for name, res in zip((s[0] for s in statements), rows, strict=True):
            for r in res if name in _EMITTING else ():
                emitted.setdefault(int(r["produced_by_run"]), []).append(int(r["seq"]))
        moved: dict[int, _Run] = {}
        for r in rows[1]:
            i = r["i"]
            run = runs[i]
            if r["run_id"] is None:
                # Another run of this mailbox moved the cursor since we read it:
                # nothing of this job was applied.
                self._failed(run, RuntimeError(
                    f"cursor moved during the run ({run.watermark} -> {r['locked'] or 0})"),
                    "transient")
                moved[i] = run
                continue
            run_id = int(r["run_id"])
            answers[i] = self._result(run, run_id, sorted(emitted.get(run_id, ())))
        answers.update(self._commit(moved))
        return answers

    def _result(self, run: _Run, run_id: int, emitted: list[int]) -> RunResult:
        job = run.job
        result = RunResult(job.job_id, job.attempt, run.outcome, run_id=run_id,
                           watermark_before=run.watermark, watermark_after=run.after,
                           records_consumed=run.consumed, error=run.error,
                           error_kind=run.kind, emitted=emitted, started_at=run.started,
                           finished_at=run.finished)
        if run.kind is not None and not run.final:
            result.retry_in = backoff(job.attempt, self.backoff_base)
        return result

    def _statements_of(self, i: int, run: _Run
                       ) -> tuple[str, list[str], list[tuple[str, tuple[Any, ...]]]]:
        """One job's part of the commit: its row of the job statements (JSON), its
        rows of the set-based emission insert (JSON), and its own statements (the
        emissions of a job that retracts, one by one in order)."""
        job, d = run.job, run.d
        assert run.finished is not None
        failed = run.kind is not None
        key = (d.name, job.reasons)
        hashes = self._hashes.get(key)
        if hashes is None:
            if len(self._hashes) > 10_000:
                self._hashes.clear()
            hashes = self._hashes[key] = definition_hashes(
                self.plan.catalog_hash, d, self._trigger_hashes, job.reasons)
        row = _dumps({
            "i": i, "job_id": job.job_id, "attempt": job.attempt, "workspace": job.workspace,
            "derivation": job.derivation, "entity": job.entity, "reasons": sorted(job.reasons),
            "hashes": hashes, "outcome": run.outcome, "started": run.started.isoformat(),
            "finished": run.finished.isoformat(), "watermark_before": run.watermark,
            "watermark_after": run.after, "consumed": run.consumed, "error": run.error,
            "error_kind": run.kind, "guard": not failed,
            "state": ("dead" if run.final else "retrying") if failed else run.outcome,
            "cursor": ("dead" if run.final else None) if failed else "advance"})
        run_key = (job.job_id, job.attempt)
        ems = [self._emit(job, em, run.finished, run_key) for em in run.emissions]
        if not any(em.get("retract") for em in run.emissions):
            return row, [_dumps({"i": i, "k": k, **e}) for k, e in enumerate(ems)], []
        own: list[tuple[str, tuple[Any, ...]]] = []
        for e in ems:
            if e["retract"]:
                # Retracting an absent value is already true and writes nothing.
                slot = f"{e['workspace']}\x1f{e['entity']}\x1f{e['collection']}\x1f{e['key']}"
                own.append(("wl_slot_lock", (slot,)))
                own.append(("wl_retract", (e["version"], run.finished, e["workspace"],
                                           e["entity"], e["collection"], e["key"]) + run_key))
            else:
                own.append(("wl_emit", (e["workspace"], e["entity"], e["collection"],
                                        e["version"], e["type"], e["key"], Jsonb(e["content"]),
                                        e["text"], e["enriched_at"], e["created_at"])
                            + run_key))
        return row, [], own

    def _emit(self, job: JobSpec, em: Mapping[str, Any], now: datetime,
              run_key: tuple[str, int]) -> dict[str, Any]:
        """One emission of the run ``run_key`` names, as a row of ``wl_emit_rows``."""
        coll = self.catalog.collections[em["collection"]]
        retract = bool(em.get("retract"))
        # Emitted rows need enrichment only when their collection declares it.
        needs = bool(coll.scorers) or any(a.required for a in coll.annotators.values())
        return {"job_id": run_key[0], "attempt": run_key[1], "workspace": job.workspace,
                "entity": job.entity, "collection": coll.name,
                "version": coll.active_version, "retract": retract,
                "type": em.get("type", ""), "key": em.get("key"),
                "content": dict(em.get("content") or {}), "text": em.get("text", ""),
                "enriched_at": None if needs and not retract else now.isoformat(),
                "created_at": now.isoformat()}

    def _run(self, statements: list[tuple[str, tuple[Any, ...]]]) -> list[list[dict[str, Any]]]:
        """Execute prepared ``statements`` as ONE query: one round trip, one implicit
        transaction (the connection is in autocommit, so a failing statement rolls
        back them all).  Returns each statement's rows."""
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
                else:
                    out.append(cur.fetchall())
        return out

    def _broken(self) -> bool:
        return self.conn.closed or self.conn.broken

    def describe(self, result: RunResult) -> str:
        return (f"{result.job_id} attempt {result.attempt}: {result.outcome} "
                f"(watermark {result.watermark_before}→{result.watermark_after}, "
                f"{result.records_consumed} consumed, finished {iso(result.finished_at)})")
