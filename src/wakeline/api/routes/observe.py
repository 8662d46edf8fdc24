"""Observing: the trigger catalog, documents with freshness, runs, jobs, replies, explain."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from psycopg.rows import dict_row

from wakeline.api import mailbox
from wakeline.api import rows as R
from wakeline.api.auth import Principal, principal
from wakeline.api.context import ApiContext
from wakeline.api.errors import NotFound, Unavailable
from wakeline.api.models import (
    MAX_BIGINT,
    DocumentOut,
    Entity,
    ExplainOut,
    Instant,
    JobId,
    JobOut,
    Name,
    RequestOut,
    RunOut,
    RunsPage,
    TriggersOut,
)
from wakeline.clock import iso
from wakeline.core.events import Read
from wakeline.store.records import Store

router = APIRouter(tags=["observe"])
Auth = Annotated[Principal, Depends(principal)]
WorkspaceQ = Annotated[Name | None, Query(description="must be the token's own workspace")]
Outcome = Literal["succeeded", "noop", "failed", "timeout", "dead"]


def _ctx(request: Request) -> ApiContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


@router.get("/triggers", response_model=TriggersOut,
            summary="The normalized trigger catalog with every condition and semantic hash")
def triggers(request: Request, who: Auth, workspace: WorkspaceQ = None) -> dict[str, Any]:
    ctx = _ctx(request)
    ws = who.check(workspace, location="query")
    with ctx.pool.connection() as conn:
        paused = R.pauses(conn, ws, ctx.clock.now())
    return {"catalog_hash": ctx.catalog.hash, "triggers": ctx.catalog_dict["triggers"],
            "paused": paused}


def _document(conn: Any, ctx: ApiContext, ws: str, entity: str) -> dict[str, Any]:
    doc: dict[str, dict[str, Any]] = {}
    for h in Store(conn, ctx.clock).keyed_heads(ws, entity):
        doc.setdefault(h.collection, {})[str(h.key)] = {
            "seq": h.seq, "type": h.type, "content": h.content, "text": h.text,
            "created_at": iso(h.created_at)}
    return doc


@router.get("/document", response_model=DocumentOut,
            summary="The entity's current keyed values now, with freshness per read-triggered "
                    "derivation (stale-while-revalidate: never waits for a run)")
def document(request: Request, who: Auth, entity: Annotated[Entity, Query()],
             max_staleness: Annotated[float | None, Query(
                 ge=0, le=10 * 365 * 86400,
                 description="seconds; older last successful runs revalidate")] = None,
             workspace: WorkspaceQ = None) -> dict[str, Any]:
    ctx = _ctx(request)
    ws = who.check(workspace, location="query")
    read_derivations = [d for d in ctx.plan.by_index if d.read_trigger is not None]
    with ctx.pool.connection() as conn:
        doc = _document(conn, ctx, ws, entity)
    out: dict[str, Any] = {"workspace": ws, "entity": entity, "as_of": iso(ctx.clock.now()),
                           "document": doc, "freshness": [], "freshness_source": "none",
                           "jobs": {}, "request_id": None}
    if not read_derivations:
        return out
    try:
        rid, reply = mailbox.ask(ctx, ws, entity, "read", ctx.settings.reply_timeout_s,
                                 max_staleness=max_staleness)
        out["request_id"] = rid
    except Unavailable:  # the document still answers; freshness says what is known
        reply = None
    if reply is not None:
        out["freshness"] = reply.get("freshness", [])
        out["freshness_source"] = "conditions"
        out["jobs"] = {j["derivation"]: j["job_id"] for j in reply.get("jobs", [])}
        return out
    # The agent did not answer in time: the same core answers from PostgreSQL rows.
    now = ctx.clock.now()
    with ctx.pool.connection() as conn:
        engine = R.engine_for(ctx.plan, conn, ws, now)
        st, _ = R.rebuilt_state(conn, engine, ws, entity, now)
    step = engine.apply(st, Read(max_staleness), now.timestamp())
    out["freshness"] = step.freshness
    out["freshness_source"] = "store"
    return out


@router.get("/runs", response_model=RunsPage, summary="Runs, newest first (keyset pagination)")
def runs(request: Request, who: Auth,
         derivation: Annotated[Name | None, Query()] = None,
         entity: Annotated[Entity | None, Query()] = None,
         outcome: Annotated[Outcome | None, Query()] = None,
         reason: Annotated[Name | None, Query(description="runs whose trigger_reasons "
                                                          "include this reason")] = None,
         since: Annotated[Instant | None, Query(description="finished at or after")] = None,
         until: Annotated[Instant | None, Query(description="finished before")] = None,
         before: Annotated[int | None, Query(ge=1, le=MAX_BIGINT,
                                             description="run_id cursor")] = None,
         limit: Annotated[int, Query(ge=1, le=500)] = 50,
         workspace: WorkspaceQ = None) -> dict[str, Any]:
    ctx = _ctx(request)
    ws = who.check(workspace, location="query")
    where: list[str] = ["workspace = %s"]
    params: list[Any] = [ws]
    for col, val in (("derivation", derivation), ("entity", entity), ("outcome", outcome)):
        if val is not None:
            where.append(f"{col} = %s")
            params.append(val)
    if reason is not None:
        where.append("%s = ANY(trigger_reasons)")
        params.append(reason)
    if since is not None:
        where.append("finished_at >= %s")
        params.append(since)
    if until is not None:
        where.append("finished_at < %s")
        params.append(until)
    if before is not None:
        where.append("run_id < %s")
        params.append(before)
    with ctx.pool.connection() as conn:
        got = R.runs_of(conn, " AND ".join(where), params, limit + 1)
    more = len(got) > limit
    got = got[:limit]
    return {"runs": got, "next_before": got[-1]["run_id"] if more and got else None}


@router.get("/runs/{run_id}", response_model=RunOut,
            summary="One run: trigger_reasons, catalog hashes, records consumed, duration, error")
def run(request: Request, who: Auth,
        run_id: Annotated[int, Path(ge=1, le=MAX_BIGINT)]) -> dict[str, Any]:
    ctx = _ctx(request)
    with ctx.pool.connection() as conn:
        got = R.runs_of(conn, "run_id = %s AND workspace = %s", [run_id, who.workspace], 1)
    if not got:
        raise NotFound(f"no run {run_id}", code="run.not_found", field="run_id",
                       location="path")
    return got[0]


@router.get("/jobs/{job_id:path}", response_model=JobOut,
            summary="A job: queued (in the mailbox), running, retrying or dead-lettered")
def job(request: Request, who: Auth, job_id: Annotated[JobId, Path()]) -> dict[str, Any]:
    ctx = _ctx(request)
    missing = NotFound(f"no job {job_id!r}", code="job.not_found", field="job_id",
                       location="path")
    if job_id.split("/", 1)[0] != who.workspace:
        raise missing  # job ids start with their workspace; another's is not found
    with ctx.pool.connection() as conn:
        row = R.job_row(conn, job_id)
        if row is not None:
            if row["workspace"] != who.workspace:
                raise missing
            return row
        found = ctx.view.find_job(job_id)
        if found is not None:
            st, derivation, state, j = found
            if st.workspace == who.workspace:
                return R.job_out(j, st.workspace, derivation, st.entity, state)
        # Not claimed yet and not (yet) seen in the changelog: a reply named it.
        rep = conn.execute(
            "SELECT entity, reply FROM stimulus_replies WHERE %s = ANY(job_ids) "
            "AND workspace = %s ORDER BY at DESC LIMIT 1", (job_id, who.workspace)).fetchone()
    if rep is None:
        raise missing
    entity, reply = rep
    for j in reply.get("jobs", []):
        if j["job_id"] == job_id:
            return {"job_id": job_id, "workspace": who.workspace, "derivation": j["derivation"],
                    "entity": entity, "state": "queued", "reasons": [], "attempts": 0,
                    "run_after": j["run_after"], "source": "mailbox"}
    raise missing


@router.get("/requests/{request_id}", response_model=RequestOut,
            summary="The conditions agent's answer to a manual run or read request")
def request_reply(request: Request, who: Auth,
                  request_id: Annotated[Name, Path()]) -> dict[str, Any]:
    ctx = _ctx(request)
    with ctx.pool.connection() as conn:
        row = conn.execute("SELECT kind, entity, reply FROM stimulus_replies "
                           "WHERE request_id = %s AND workspace = %s",
                           (request_id, who.workspace)).fetchone()
    if row is None:
        raise NotFound(f"no answer for request {request_id!r} (yet)", code="request.not_found",
                       field="request_id", location="path")
    return {"request_id": request_id, "kind": row[0], "entity": row[1], "reply": row[2]}


@router.get("/explain", response_model=ExplainOut,
            summary="Why (not): per condition, holds or not and why; plus the last outcomes")
def explain(request: Request, who: Auth, trigger: Annotated[Name, Query()],
            entity: Annotated[Entity, Query()],
            outcomes: Annotated[int, Query(ge=0, le=200)] = 20,
            workspace: WorkspaceQ = None) -> dict[str, Any]:
    ctx = _ctx(request)
    ws = who.check(workspace, location="query")
    trig = ctx.plan.triggers.get(trigger)
    if trig is None:
        raise NotFound(f"unknown trigger {trigger!r}; known: "
                       f"{', '.join(sorted(ctx.plan.triggers))}", code="trigger.unknown",
                       field="trigger", location="query")
    now = ctx.clock.now()
    with ctx.pool.connection() as conn:
        engine = R.engine_for(ctx.plan, conn, ws, now)
        st, cursors = R.rebuilt_state(conn, engine, ws, entity, now)
        paused = R.pauses(conn, ws, now, trigger).get(trigger)
        last = R.runs_of(conn, "workspace = %s AND derivation = %s AND entity = %s",
                         [ws, trig.derivation, entity], 1)
        with conn.cursor(row_factory=dict_row) as cur:
            recent = cur.execute(
                "SELECT id, kind, reason, detail, at, trigger FROM outcomes WHERE workspace = %s "
                "AND entity = %s AND derivation = %s AND (trigger = %s OR trigger IS NULL) "
                "ORDER BY id DESC LIMIT %s",
                (ws, entity, trig.derivation, trigger, outcomes)).fetchall()
    conditions = engine.explain(st, trigger, now.timestamp())
    live = ctx.view.state(ws, entity)
    mailbox_view: dict[str, Any] | None = None
    if live is not None and trig.derivation in live.ds:
        ds = live.ds[trig.derivation]
        mailbox_view = {
            "watermark": ds.w,
            "queued": R.job_out(ds.queued, ws, trig.derivation, entity, "queued")
            if ds.queued else None,
            "running": R.job_out(ds.running, ws, trig.derivation, entity, "running")
            if ds.running else None,
            "waiting_on_unready_seq": ds.waiting_on, "dead": ds.dead}
    return {"trigger": trigger, "derivation": trig.derivation, "entity": entity,
            "now": iso(now), "conditions": conditions, "cooldown_s": trig.cooldown_s,
            "debounce_s": trig.debounce_s, "paused": paused,
            "cursor": cursors.get(trig.derivation), "mailbox": mailbox_view,
            "last_run": last[0] if last else None,
            "last_outcomes": [{**o, "at": iso(o["at"])} for o in recent]}
