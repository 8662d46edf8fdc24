"""The record writes users need: insert, mark ready, retract; and keyed heads.

Every function here runs on a caller-supplied connection so several writes can
share one transaction (the derive worker co-commits outputs, watermark and run
row).  ``Store`` does not commit on its own unless it opened the connection.

Keyed heads: a keyed collection holds one current value per
(workspace, entity, collection, key) slot — the latest *ready* row with status
``active`` by ``seq`` wins.  A tombstone is such a row whose only job is to say
the key no longer holds a value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from wakeline.clock import Clock, SystemClock
from wakeline.core.plan import Rec
from wakeline.errors import StoreError


class RecordNotFound(StoreError):
    code = "store.record_not_found"


class NoLiveHead(StoreError):
    code = "store.no_live_head"


class InvalidRecord(StoreError):
    code = "store.invalid_record"


_COLUMNS = (
    "seq, workspace, entity, collection, collection_version, type, status, key, content, "
    "text, tombstone, parents, annotations, scores, enriched_at, created_at, produced_by_run"
)


@dataclass(frozen=True)
class Record:
    seq: int
    workspace: str
    entity: str
    collection: str
    collection_version: int
    type: str
    status: str
    key: str | None
    content: dict[str, Any]
    text: str
    tombstone: bool
    parents: list[int]
    annotations: dict[str, Any]
    scores: dict[str, Any]
    enriched_at: datetime | None
    created_at: datetime
    produced_by_run: int | None = None

    @property
    def ready(self) -> bool:
        return self.enriched_at is not None


@dataclass(frozen=True)
class NewRecord:
    """A record to insert.  ``ready=True`` sets ``enriched_at`` at insert time."""

    workspace: str
    entity: str
    collection: str
    collection_version: int = 1
    type: str = ""
    status: str = "active"
    key: str | None = None
    content: Mapping[str, Any] = field(default_factory=dict)
    text: str = ""
    parents: Sequence[int] = ()
    annotations: Mapping[str, Any] = field(default_factory=dict)
    scores: Mapping[str, Any] = field(default_factory=dict)
    ready: bool = False
    produced_by_run: int | None = None


#: The columns :func:`row_to_rec` reads.
REC_COLUMNS = ("seq, collection, collection_version, type, status, key, content, text, "
               "tombstone, parents, annotations, scores, enriched_at, created_at")


def row_to_rec(row: Mapping[str, Any]) -> Rec:
    """A ``records`` row (a dict with :data:`REC_COLUMNS`) as the core's :class:`Rec`."""
    return Rec(row["seq"], row["collection"], row["collection_version"], row["type"],
               row["status"], row["key"], row["content"], row["text"], row["tombstone"],
               row["annotations"], row["scores"],
               row["enriched_at"].timestamp() if row["enriched_at"] else None,
               row["created_at"].timestamp(), tuple(row["parents"] or ()))


def prior_head(conn: psycopg.Connection[Any], workspace: str, entity: str, collection: str,
               key: str, below: int) -> Rec | None:
    """The slot's latest ready ``active`` row with ``seq < below`` (what an erasure of
    the rows from ``below`` on leaves as the head), or None."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            f"SELECT {REC_COLUMNS} FROM records WHERE workspace = %s AND entity = %s "
            "AND collection = %s AND key = %s AND seq < %s AND status = 'active' "
            "AND enriched_at IS NOT NULL ORDER BY seq DESC LIMIT 1",
            (workspace, entity, collection, key, below)).fetchone()
    return row_to_rec(row) if row else None


def _row_to_record(row: Mapping[str, Any]) -> Record:
    return Record(**{k: row[k] for k in Record.__dataclass_fields__})


class Store:
    """Record writes and reads on one psycopg connection."""

    def __init__(self, conn: psycopg.Connection[Any], clock: Clock | None = None) -> None:
        self.conn = conn
        self.clock = clock or SystemClock()

    @classmethod
    def connect(cls, dsn: str, clock: Clock | None = None) -> Store:
        return cls(psycopg.connect(dsn, autocommit=True), clock)

    def close(self) -> None:
        self.conn.close()

    # -- writes ---------------------------------------------------------------

    def insert_record(self, record: NewRecord | None = None, /, **fields: Any) -> int:
        """Insert one record and return its global ``seq``."""
        rec = record if record is not None else NewRecord(**fields)
        return self.insert_records([rec])[0]

    def insert_records(self, records: Iterable[NewRecord]) -> list[int]:
        """Insert records in one statement each, in order, inside one transaction."""
        now = self.clock.now()
        seqs: list[int] = []
        with self.conn.transaction(), self.conn.cursor() as cur:
            for rec in records:
                if "tombstone" in rec.content:
                    raise InvalidRecord(
                        "content may not set 'tombstone': retract the key with "
                        "Store.retract (or emit retract: true from a derivation)",
                        entity=rec.entity, collection=rec.collection,
                    )
                cur.execute(
                    "INSERT INTO records (workspace, entity, collection, collection_version, "
                    "type, status, key, content, text, parents, annotations, scores, "
                    "enriched_at, created_at, produced_by_run) VALUES "
                    "(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) RETURNING seq",
                    (
                        rec.workspace, rec.entity, rec.collection, rec.collection_version,
                        rec.type, rec.status, rec.key, Jsonb(dict(rec.content)), rec.text,
                        list(rec.parents), Jsonb(dict(rec.annotations)), Jsonb(dict(rec.scores)),
                        now if rec.ready else None, now, rec.produced_by_run,
                    ),
                )
                row = cur.fetchone()
                assert row is not None
                seqs.append(int(row[0]))
        return seqs

    def mark_ready(
        self,
        seqs: Sequence[int],
        *,
        annotations: Mapping[int, Mapping[str, Any]] | None = None,
        scores: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Mark unready records ready in ONE UPDATE, merging annotations and scores.

        Records already ready are left untouched (idempotent).  Returns the seqs
        this call made ready.
        """
        if not seqs:
            return []
        annotations = annotations or {}
        scores = scores or {}
        ann = [Jsonb(dict(annotations.get(s, {}))) for s in seqs]
        sco = [Jsonb(dict(scores.get(s, {}))) for s in seqs]
        rows = self.conn.execute(
            "UPDATE records r SET annotations = r.annotations || v.ann, "
            "scores = r.scores || v.sco, enriched_at = %s "
            "FROM unnest(%s::bigint[], %s::jsonb[], %s::jsonb[]) AS v(seq, ann, sco) "
            "WHERE r.seq = v.seq AND r.enriched_at IS NULL RETURNING r.seq",
            (self.clock.now(), list(seqs), ann, sco),
        ).fetchall()
        return sorted(int(r[0]) for r in rows)

    def retract(
        self,
        workspace: str,
        entity: str,
        collection: str,
        key: str,
        *,
        collection_version: int = 1,
        produced_by_run: int | None = None,
    ) -> int:
        """Write a tombstone for the live head of a keyed slot; return its seq.

        The tombstone is system-shaped (``content = {"tombstone": true}``, empty
        text), ready at once, and names the head it retracts as its parent.
        """
        with self.conn.transaction():
            head = self._head_row(workspace, entity, collection, key, lock=True)
            if head is None or head["tombstone"]:
                raise NoLiveHead(
                    f"{collection}.{key} of {entity} holds no live value to retract",
                    workspace=workspace, entity=entity, collection=collection, key=key,
                )
            now = self.clock.now()
            row = self.conn.execute(
                "INSERT INTO records (workspace, entity, collection, collection_version, type, "
                "status, key, content, text, tombstone, parents, enriched_at, created_at, "
                "produced_by_run) VALUES (%s,%s,%s,%s,%s,'active',%s,%s,'',true,%s,%s,%s,%s) "
                "RETURNING seq",
                (workspace, entity, collection, collection_version, head["type"], key,
                 Jsonb({"tombstone": True}), [head["seq"]], now, now, produced_by_run),
            ).fetchone()
            assert row is not None
            return int(row[0])

    # -- reads ----------------------------------------------------------------

    def get_record(self, seq: int) -> Record:
        with self.conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(f"SELECT {_COLUMNS} FROM records WHERE seq = %s", (seq,)).fetchone()
        if row is None:
            raise RecordNotFound(f"no record with seq {seq}", seq=seq)
        return _row_to_record(row)

    def keyed_heads(
        self,
        workspace: str,
        entity: str,
        collection: str | None = None,
        *,
        include_tombstones: bool = False,
    ) -> list[Record]:
        """The current head of every keyed slot of an entity (ready, active rows)."""
        sql = (
            f"SELECT DISTINCT ON (collection, key) {_COLUMNS} FROM records "
            "WHERE workspace = %s AND entity = %s AND key IS NOT NULL "
            "AND enriched_at IS NOT NULL AND status = 'active'"
        )
        params: list[Any] = [workspace, entity]
        if collection is not None:
            sql += " AND collection = %s"
            params.append(collection)
        sql += " ORDER BY collection, key, seq DESC"
        with self.conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(sql, params).fetchall()
        heads = [_row_to_record(r) for r in rows]
        if not include_tombstones:
            heads = [h for h in heads if not h.tombstone]
        return heads

    def _head_row(
        self, workspace: str, entity: str, collection: str, key: str, *, lock: bool = False
    ) -> dict[str, Any] | None:
        if lock:
            # Serialize retractions of one slot so two cannot both see the live head.
            self.conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"{workspace}\x1f{entity}\x1f{collection}\x1f{key}",),
            )
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                f"SELECT {_COLUMNS} FROM records WHERE workspace = %s AND entity = %s "
                "AND collection = %s AND key = %s AND enriched_at IS NOT NULL "
                "AND status = 'active' ORDER BY seq DESC LIMIT 1",
                (workspace, entity, collection, key),
            ).fetchone()
