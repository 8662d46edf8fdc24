"""Reads the API serves from PostgreSQL: runs, jobs, pauses, and an entity's core
state rebuilt from its rows (:func:`wakeline.core.rebuild.rebuild`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from wakeline.clock import iso
from wakeline.core.engine import Engine
from wakeline.core.rebuild import CursorRow, rebuild
from wakeline.core.state import EntityState, Job
from wakeline.store.records import REC_COLUMNS, row_to_rec

RUN_COLUMNS = ("run_id, job_id, attempt, workspace, derivation, entity, trigger_reasons, "
               "definition_hashes, outcome, started_at, finished_at, watermark_before, "
               "watermark_after, records_consumed, error, error_kind")


def ts(t: float | None) -> str | None:
    return iso(datetime.fromtimestamp(t, UTC)) if t is not None else None


def run_out(r: dict[str, Any]) -> dict[str, Any]:
    out = dict(r)
    out["trigger_reasons"] = list(r["trigger_reasons"] or [])
    out["started_at"] = iso(r["started_at"])
    out["finished_at"] = iso(r["finished_at"])
    out["duration_s"] = max(0.0, (r["finished_at"] - r["started_at"]).total_seconds())
    return out


def runs_of(conn: psycopg.Connection[Any], where: str, params: list[Any],
            limit: int) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE {where} "
                           "ORDER BY run_id DESC LIMIT %s", [*params, limit]).fetchall()
    return [run_out(r) for r in rows]


def job_row(conn: psycopg.Connection[Any], job_id: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT job_id, workspace, derivation, entity, state, reasons, run_after, attempts, "
            "last_error, error_kind, created_at, updated_at FROM jobs WHERE job_id = %s",
            (job_id,)).fetchone()
        if row is None:
            return None
        runs = cur.execute("SELECT run_id FROM runs WHERE job_id = %s ORDER BY run_id",
                           (job_id,)).fetchall()
    row["reasons"] = list(row["reasons"] or [])
    for k in ("run_after", "created_at", "updated_at"):
        row[k] = iso(row[k])
    row["runs"] = [r["run_id"] for r in runs]
    row["source"] = "store"
    return row


def pauses(conn: psycopg.Connection[Any], workspace: str, now: datetime,
           trigger: str | None = None) -> dict[str, dict[str, Any]]:
    """The open pauses of a workspace at ``now`` (released or expired ones excluded)."""
    rows = conn.execute(
        "SELECT trigger, reason, until, created_at FROM trigger_pauses WHERE workspace = %s "
        "AND released_at IS NULL AND (until IS NULL OR until > %s) "
        "AND (%s::text IS NULL OR trigger = %s) ORDER BY trigger",
        (workspace, now, trigger, trigger)).fetchall()
    return {t: {"trigger": t, "paused": True, "reason": reason, "until": iso(until),
                "paused_at": iso(created)} for t, reason, until, created in rows}


def engine_for(plan: Any, conn: psycopg.Connection[Any], workspace: str, now: datetime) -> Engine:
    """An engine with the workspace's operator pauses, as the conditions agent has it."""
    engine = Engine(plan)
    for t, p in pauses(conn, workspace, now).items():
        until = datetime.fromisoformat(p["until"].replace("Z", "+00:00")).timestamp() \
            if p["until"] else None
        engine.pause(t, p["reason"], until)
    return engine


def rebuilt_state(conn: psycopg.Connection[Any], engine: Engine, workspace: str, entity: str,
                  now: datetime) -> tuple[EntityState, dict[str, dict[str, Any]]]:
    """The entity's core state from its rows; plus its cursor rows by derivation.

    The mailbox part is approximate: running jobs come from the jobs table, a dead
    last run from the cursor row; queued jobs are re-derived by re-evaluation."""
    with conn.cursor(row_factory=dict_row) as cur:
        recs = cur.execute(f"SELECT {REC_COLUMNS} FROM records WHERE workspace = %s "
                           "AND entity = %s ORDER BY seq", (workspace, entity)).fetchall()
        cursors = cur.execute(
            "SELECT derivation, watermark, last_run_at, last_success_at, at_handled_through, "
            "last_outcome, last_job_id, last_run_id FROM derivation_cursors "
            "WHERE workspace = %s AND entity = %s", (workspace, entity)).fetchall()
        running = cur.execute(
            "SELECT job_id, derivation, reasons, created_at FROM jobs WHERE workspace = %s "
            "AND entity = %s AND state IN ('running', 'retrying')",
            (workspace, entity)).fetchall()
    rows = [CursorRow(c["derivation"], int(c["watermark"]),
                      c["last_success_at"].timestamp() if c["last_success_at"] else None,
                      c["last_run_at"].timestamp() if c["last_run_at"] else None,
                      c["at_handled_through"].timestamp() if c["at_handled_through"] else None)
            for c in cursors]
    st = rebuild(engine, workspace, entity, [row_to_rec(r) for r in recs], rows,
                 now.timestamp()).state
    for c in cursors:
        if c["derivation"] in st.ds and c["last_outcome"] == "dead":
            st.ds[c["derivation"]].dead = True
    for j in running:
        if j["derivation"] in engine.plan.derivations:
            st.d(j["derivation"]).running = Job(j["job_id"], {r: 0.0 for r in j["reasons"]},
                                                j["created_at"].timestamp())
    by_name = {c["derivation"]: {
        "watermark": int(c["watermark"]), "last_run_at": iso(c["last_run_at"]),
        "last_success_at": iso(c["last_success_at"]), "last_outcome": c["last_outcome"],
        "last_job_id": c["last_job_id"], "last_run_id": c["last_run_id"]} for c in cursors}
    return st, by_name


def job_out(job: Job, workspace: str, derivation: str, entity: str, state: str) -> dict[str, Any]:
    return {"job_id": job.id, "workspace": workspace, "derivation": derivation, "entity": entity,
            "state": state, "reasons": job.sorted_reasons(), "run_after": ts(job.run_after),
            "attempts": 0, "created_at": ts(job.created), "updated_at": None, "runs": [],
            "source": "mailbox", "settle": list(job.settle),
            "reason_times": {r: ts(t) for r, t in sorted(job.reasons.items())}}
