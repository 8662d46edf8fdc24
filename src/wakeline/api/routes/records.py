"""Records: insert (unready or ready), batch insert, mark ready, retract a keyed value."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from wakeline.api.auth import Principal, principal
from wakeline.api.context import ApiContext
from wakeline.api.errors import Conflict, Invalid, NotFound
from wakeline.api.models import (
    InsertedBatchOut,
    InsertedOut,
    MarkReadyIn,
    ReadyOut,
    RecordBatchIn,
    RecordIn,
    RetractIn,
)
from wakeline.store.records import NewRecord, NoLiveHead, Store

router = APIRouter(tags=["records"])
Auth = Annotated[Principal, Depends(principal)]


def _ctx(request: Request) -> ApiContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


def to_new_record(ctx: ApiContext, ws: str, rec: RecordIn, prefix: str = "") -> NewRecord:
    """Check a record against the catalog (422 with the failing field) and convert it."""
    coll = ctx.catalog.collections.get(rec.collection)
    if coll is None:
        raise Invalid(f"unknown collection {rec.collection!r}; known: "
                      f"{', '.join(sorted(ctx.catalog.collections))}",
                      code="collection.unknown", field=f"{prefix}collection", location="body")
    version = rec.collection_version or coll.active_version
    if version not in {v.version for v in coll.versions}:
        raise Invalid(f"{coll.name} has no version {version}", code="collection.version_unknown",
                      field=f"{prefix}collection_version", location="body")
    if coll.keyed and rec.key is None:
        raise Invalid(f"{coll.name} is keyed: a record needs a key", code="record.key_required",
                      field=f"{prefix}key", location="body")
    if not coll.keyed and rec.key is not None:
        raise Invalid(f"{coll.name} holds events: a record has no key",
                      code="record.key_forbidden", field=f"{prefix}key", location="body")
    if coll.keys is not None and rec.key is not None and rec.key not in coll.keys:
        raise Invalid(f"{coll.name} declares keys {list(coll.keys)}; {rec.key!r} is not one",
                      code="record.key_unknown", field=f"{prefix}key", location="body")
    if coll.types is not None and rec.type not in coll.types:
        raise Invalid(f"{coll.name} declares types {list(coll.types)}; {rec.type!r} is not one",
                      code="record.type_unknown", field=f"{prefix}type", location="body")
    if "tombstone" in rec.content:
        raise Invalid("content may not set 'tombstone': retract the key with "
                      "POST /records/retract", code="record.tombstone_content",
                      field=f"{prefix}content.tombstone", location="body")
    return NewRecord(workspace=ws, entity=rec.entity, collection=coll.name,
                     collection_version=version, type=rec.type, status=rec.status, key=rec.key,
                     content=rec.content, text=rec.text, parents=tuple(rec.parents),
                     annotations=rec.annotations, scores=rec.scores, ready=rec.ready)


@router.post("/records", status_code=201, response_model=InsertedOut,
             summary="Insert one record (unready by default)")
def insert_record(body: RecordIn, request: Request, who: Auth) -> dict[str, Any]:
    ctx = _ctx(request)
    ws = who.check(body.workspace)
    rec = to_new_record(ctx, ws, body)
    with ctx.pool.connection() as conn:
        seq = Store(conn, ctx.clock).insert_records([rec])[0]
    return {"seq": seq}


@router.post("/records/batch", status_code=201, response_model=InsertedBatchOut,
             summary="Insert records in one transaction, in order")
def insert_batch(body: RecordBatchIn, request: Request, who: Auth) -> dict[str, Any]:
    ctx = _ctx(request)
    ws = who.check(body.workspace)
    recs = []
    for i, r in enumerate(body.records):
        who.check(r.workspace, field=f"records.{i}.workspace")
        recs.append(to_new_record(ctx, ws, r, prefix=f"records.{i}."))
    with ctx.pool.connection() as conn:
        seqs = Store(conn, ctx.clock).insert_records(recs)
    return {"seqs": seqs}


@router.post("/records/ready", response_model=ReadyOut,
             summary="Mark unready records ready, merging annotations and scores (one UPDATE)")
def mark_ready(body: MarkReadyIn, request: Request, who: Auth) -> dict[str, Any]:
    ctx = _ctx(request)
    ws = who.check(body.workspace)
    wanted = list(dict.fromkeys(body.seqs))
    for name, extra in (("annotations", body.annotations), ("scores", body.scores)):
        stray = sorted(set(extra) - set(wanted))
        if stray:
            raise Invalid(f"{name} for seq {stray[0]}, which is not in seqs",
                          code="record.not_listed", field=f"{name}.{stray[0]}", location="body")
    with ctx.pool.connection() as conn:
        rows = conn.execute("SELECT seq, enriched_at IS NOT NULL FROM records "
                            "WHERE seq = ANY(%s) AND workspace = %s", (wanted, ws)).fetchall()
        found = {int(s): bool(r) for s, r in rows}
        for i, s in enumerate(wanted):
            if s not in found:
                raise NotFound(f"no record with seq {s} in workspace {ws!r}",
                               code="record.not_found", field=f"seqs.{i}", location="body")
        made = Store(conn, ctx.clock).mark_ready(wanted, annotations=body.annotations,
                                                 scores=body.scores)
    return {"ready": made, "already_ready": sorted(s for s in wanted if s not in made)}


@router.post("/records/retract", status_code=201, response_model=InsertedOut,
             summary="Retract a keyed value: a tombstone naming the head it retracts")
def retract(body: RetractIn, request: Request, who: Auth) -> dict[str, Any]:
    ctx = _ctx(request)
    ws = who.check(body.workspace)
    coll = ctx.catalog.collections.get(body.collection)
    if coll is None:
        raise Invalid(f"unknown collection {body.collection!r}", code="collection.unknown",
                      field="collection", location="body")
    if not coll.keyed:
        raise Invalid(f"{coll.name} holds events: only keyed values can be retracted",
                      code="record.not_keyed", field="collection", location="body")
    with ctx.pool.connection() as conn:
        try:
            seq = Store(conn, ctx.clock).retract(ws, body.entity, coll.name, body.key,
                                                 collection_version=coll.active_version)
        except NoLiveHead as exc:
            raise Conflict(str(exc), code=exc.code, field="key", location="body") from exc
    return {"seq": seq}
