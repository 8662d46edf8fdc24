"""Operator and application controls: manual runs, pausing and resuming triggers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse

from wakeline.api import mailbox
from wakeline.api import rows as R
from wakeline.api.auth import Principal, principal
from wakeline.api.context import ApiContext
from wakeline.api.errors import Invalid, NotFound
from wakeline.api.models import ManualRunIn, ManualRunOut, Name, PauseIn, PauseOut, ResumeIn
from wakeline.clock import iso

router = APIRouter(tags=["control"])
Auth = Annotated[Principal, Depends(principal)]


def _ctx(request: Request) -> ApiContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


@router.post("/processors/{derivation}/run", status_code=202, response_model=ManualRunOut,
             responses={200: {"model": ManualRunOut}},
             summary="Enqueue a manual run (reason `manual`, bypasses cooldown)")
def manual_run(body: ManualRunIn, request: Request, who: Auth,
               derivation: Annotated[Name, Path()]) -> Any:
    """Answers once the entity's mailbox has taken the request: the job id, whether
    it coalesced into a queued job, and the effective run_after.  It never waits for
    the run.  If the mailbox does not answer within the configured time the request
    is still in the log: ``status: pending`` and ``GET /requests/{request_id}``."""
    ctx = _ctx(request)
    ws = who.check(body.workspace)
    if derivation not in ctx.plan.derivations:
        raise NotFound(f"unknown derivation {derivation!r}; known: "
                       f"{', '.join(sorted(ctx.plan.derivations))}", code="derivation.unknown",
                       field="derivation", location="path")
    run_after = body.run_after.timestamp() if body.run_after else None
    rid, reply = mailbox.ask(ctx, ws, body.entity, "manual", ctx.settings.manual_timeout_s,
                             derivation=derivation, run_after=run_after)
    job = (reply or {}).get("job")
    if job is None:
        return {"status": "pending", "job_id": None, "coalesced": None,
                "run_after": iso(body.run_after) if body.run_after else None,
                "derivation": derivation, "entity": body.entity, "request_id": rid}
    out = {"status": "coalesced" if job["coalesced"] else "enqueued", "job_id": job["job_id"],
           "coalesced": job["coalesced"], "run_after": job["run_after"],
           "derivation": derivation, "entity": body.entity, "request_id": rid}
    return JSONResponse(status_code=200 if job["coalesced"] else 202, content=out)


def _trigger(ctx: ApiContext, name: str) -> None:
    if name not in ctx.plan.triggers:
        raise NotFound(f"unknown trigger {name!r}; known: {', '.join(sorted(ctx.plan.triggers))}",
                       code="trigger.unknown", field="name", location="path")


@router.post("/triggers/{name}/pause", response_model=PauseOut,
             summary="Pause a trigger (durable), optionally until an instant")
def pause(body: PauseIn, request: Request, who: Auth, name: Annotated[Name, Path()]) -> Any:
    """While paused, the trigger's conditions record a ``paused`` outcome instead of
    enqueueing; its data stays pending above the watermark.  When the pause ends
    (resume, or ``until`` passes) every entity it held back is re-evaluated."""
    ctx = _ctx(request)
    ws = who.check(body.workspace)
    _trigger(ctx, name)
    now = ctx.clock.now()
    if body.until is not None and body.until <= now:
        raise Invalid(f"until {iso(body.until)} is not after now ({iso(now)})",
                      code="pause.until_past", field="until", location="body")
    with ctx.pool.connection() as conn:
        conn.execute(
            "INSERT INTO trigger_pauses (workspace, trigger, reason, until, created_at, "
            "paused_by, released_at) VALUES (%s,%s,%s,%s,%s,%s,NULL) "
            "ON CONFLICT (workspace, trigger) DO UPDATE SET reason = EXCLUDED.reason, "
            "until = EXCLUDED.until, paused_by = EXCLUDED.paused_by, released_at = NULL, "
            # A pause renewed while still open keeps its start: the entities it has held
            # back since then are all re-evaluated when it ends.
            "created_at = CASE WHEN trigger_pauses.released_at IS NULL "
            "AND (trigger_pauses.until IS NULL OR trigger_pauses.until > EXCLUDED.created_at) "
            "THEN trigger_pauses.created_at ELSE EXCLUDED.created_at END",
            (ws, name, body.reason, body.until, now, f"api:{ws}"))
        return R.pauses(conn, ws, now, name)[name]


@router.post("/triggers/{name}/resume", response_model=PauseOut,
             summary="Resume a paused trigger; what it held back is re-evaluated")
def resume(request: Request, who: Auth, name: Annotated[Name, Path()],
           body: ResumeIn | None = None) -> Any:
    ctx = _ctx(request)
    ws = who.check(body.workspace if body else None)
    _trigger(ctx, name)
    now = ctx.clock.now()
    with ctx.pool.connection() as conn:
        # The pause ends now; the conditions agent releases it (once) and re-evaluates
        # the entities it held back (wakeline.streams.pauses).
        row = conn.execute(
            "UPDATE trigger_pauses SET until = %s WHERE workspace = %s AND trigger = %s "
            "AND released_at IS NULL AND (until IS NULL OR until > %s) RETURNING trigger",
            (now, ws, name, now)).fetchone()
    return {"trigger": name, "paused": False, "was_paused": row is not None}
