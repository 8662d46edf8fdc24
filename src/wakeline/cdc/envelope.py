"""THE parser of change envelopes — from Debezium or from the relay, same code.

:func:`parse` takes one Kafka message (value bytes, optional key bytes) and
returns a typed event, ``None`` for a Kafka tombstone (null value), or raises
an :class:`~wakeline.cdc.errors.EnvelopeError` whose ``code`` says why (the
dead-letter reason).

Events of ``records`` rows::

    ReadyRecord    an insert (or snapshot read) of a ready row, or an
                   unready → ready update (``transition=True``); a tombstone
                   is a ReadyRecord with ``tombstone=True``
    UnreadyInsert  an insert (or snapshot read) of a row not yet enriched —
                   only the core's readiness gate looks at it
    RecordUpdate   any other update (ready → ready, unready → unready, …),
                   e.g. to re-arm an ``at`` deadline
    RecordDelete   a deleted row (``before`` is the whole row)

and of ``derivation_cursors`` rows: :class:`CursorAdvance`.  Every event also
carries :class:`RawChange`, the change-feed handler's view (seed 004:
``table``, ``id``, ``op``, ``new``, ``old``, ``ts``, ``changeId`` =
``<table>:<id>:<lsn>``).  Debezium's transaction-metadata events parse to
:class:`TransactionMarker` (BEGIN / END with ``event_count``).

Values: instants are float epoch seconds (``io.debezium.time.ZonedTimestamp``
ISO strings on the wire), ``content``/``annotations``/``scores`` dicts (JSON
strings on the wire, ``io.debezium.data.Json``), ``parents`` a tuple.  A
``__debezium_unavailable_value`` (unchanged TOAST) is filled from ``before``.

Ordering: ``source.lsn`` is the change's own WAL position, which is NOT
monotonic in commit order (a transaction that began earlier can commit later).
``position`` is: ``(end LSN of the previous commit << 64) | lsn`` from
``source.sequence`` — increasing in commit order along a partition — or 0 when
unknown (snapshot reads, the first commit after a connector start), meaning
"apply, do not deduplicate".  :meth:`RecordEvent.record_changed` puts it in
:attr:`RecordChanged.lsn`, the core's redelivery guard.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal
from urllib.parse import quote

import orjson

from wakeline.cdc._json import loads
from wakeline.cdc.errors import (
    BadValue,
    MissingField,
    NotAnEnvelope,
    NotJson,
    Oversized,
    UnknownOp,
    UnknownTable,
)
from wakeline.core.codec import _ccodec
from wakeline.core.events import CursorAdvanced, RecordChanged
from wakeline.core.plan import Rec

#: Default upper bound on one message value (bytes); larger ones are dead-lettered.
DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024
RECORDS: Final = "records"
CURSORS: Final = "derivation_cursors"
TABLES: Final = frozenset({RECORDS, CURSORS})
OPS: Final = frozenset({"c", "u", "d", "r"})
UNAVAILABLE: Final = "__debezium_unavailable_value"
_RAW_OPS: Final[Mapping[str, Literal["insert", "update", "delete"]]] = {
    "c": "insert", "r": "insert", "u": "update", "d": "delete"}
_JSON_COLUMNS: Final = {RECORDS: ("content", "annotations", "scores"), CURSORS: ()}
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


# -- the pieces every event carries -----------------------------------------


# The per-change classes below are plain (not frozen) dataclasses: a frozen one sets
# each field through ``object.__setattr__``, and these are built once per change on the
# readiness stage's hot path (frozen, ``parse`` took 25 us per record envelope; then
# 16-19).  They are slotted: the C parser (``_ccodec.parse_record``) fills their slots
# directly.  Treat them as immutable all the same.
@dataclass(slots=True)
class Source:
    """The ``source`` block, typed.  ``snapshot`` is None while streaming."""

    table: str
    schema: str | None = None
    db: str | None = None
    connector: str | None = None
    name: str | None = None
    version: str | None = None
    lsn: int | None = None
    tx_id: int | None = None
    ts_us: int | None = None  # commit time (snapshot start for reads)
    snapshot: str | None = None
    prev_commit_lsn: int | None = None  # first element of source.sequence

    @property
    def is_snapshot(self) -> bool:
        return self.snapshot not in (None, "false")

    @property
    def commit_time(self) -> float | None:
        return None if self.ts_us is None else self.ts_us / 1e6


@dataclass(frozen=True)
class TxInfo:
    """The ``transaction`` block (``provide.transaction.metadata=true``)."""

    id: str
    total_order: int
    data_collection_order: int


@dataclass(frozen=True)
class RawChange:
    """A change as a change-feed handler sees it (seed 004's ``LogChange``)."""

    table: str
    id: str
    op: Literal["insert", "update", "delete"]
    new: dict[str, Any] | None
    old: dict[str, Any] | None
    ts: float
    change_id: str
    lsn: int
    tx_id: int | None
    snapshot: bool

    def to_dict(self) -> dict[str, Any]:
        """The handler payload: ``{table, id, op, newDoc, oldDoc, ts, changeId}``."""
        return {"table": self.table, "id": self.id, "op": self.op, "newDoc": self.new,
                "oldDoc": self.old, "ts": self.ts, "changeId": self.change_id}


@dataclass(slots=True)
class _Change:
    op: str  # c | u | d | r
    workspace: str
    entity: str
    source: Source
    #: what :attr:`raw` is built from, on first use: (row id, decoded new row, decoded
    #: old row); only change-feed handlers read it, the condition path never does
    raw_parts: tuple[str, dict[str, Any] | None, dict[str, Any] | None] = field(
        repr=False, compare=False)
    position: int
    ts_ms: int | None = None  # when the connector wrote the event
    transaction: TxInfo | None = None
    _raw: RawChange | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def raw(self) -> RawChange:
        """The change-feed handler's view of this change (built on first use)."""
        if self._raw is None:
            row_id, new, old = self.raw_parts
            src = self.source
            lsn = src.lsn or 0
            self._raw = RawChange(
                table=src.table, id=row_id, op=_RAW_OPS[self.op], new=new, old=old,
                ts=(src.ts_us or 0) / 1e6, change_id=f"{src.table}:{row_id}:{lsn}",
                lsn=lsn, tx_id=src.tx_id, snapshot=src.is_snapshot or self.op == "r")
        return self._raw

    @property
    def table(self) -> str:
        return self.source.table

    @property
    def lsn(self) -> int:
        return self.source.lsn or 0

    @property
    def tx_id(self) -> int | None:
        return self.source.tx_id

    @property
    def snapshot(self) -> bool:
        return self.source.is_snapshot

    @property
    def change_id(self) -> str:
        return self.raw.change_id


@dataclass(slots=True)
class RecordEvent(_Change):
    """A change of a ``records`` row (base of the four record event types)."""

    after: Rec | None = None
    before: Rec | None = None

    @property
    def record(self) -> Rec:
        """The row as it is now (``before`` for a delete)."""
        rec = self.after if self.after is not None else self.before
        assert rec is not None
        return rec

    @property
    def seq(self) -> int:
        return self.record.seq

    def record_changed(self) -> RecordChanged:
        """The core's event (``lsn`` is :attr:`position`, the redelivery guard)."""
        return RecordChanged(self.op, self.after, self.before, self.position)


@dataclass(slots=True)
class ReadyRecord(RecordEvent):
    """A record that just became trigger-visible (insert, read, or unready→ready)."""

    transition: bool = False  # True for an unready → ready update

    @property
    def tombstone(self) -> bool:
        return self.record.tombstone


@dataclass(slots=True)
class UnreadyInsert(RecordEvent):
    """A record inserted (or read) before enrichment: for the readiness gate only."""


@dataclass(slots=True)
class RecordUpdate(RecordEvent):
    """An update that is not a readiness transition."""


@dataclass(slots=True)
class RecordDelete(RecordEvent):
    """A deleted row (``before`` holds it, ``after`` is None)."""


@dataclass(slots=True)
class CursorRow:
    """A ``derivation_cursors`` row.  Instants are epoch seconds."""

    workspace: str
    derivation: str
    entity: str
    watermark: int = 0
    last_run_at: float | None = None
    last_success_at: float | None = None
    last_run_id: int | None = None
    at_handled_through: float | None = None
    advance_count: int = 0
    updated_at: float | None = None
    last_outcome: str | None = None
    last_job_id: str | None = None


@dataclass(slots=True)
class CursorAdvance(_Change):
    """A change of a cursor row (insert, update, delete or snapshot read)."""

    row: CursorRow | None = None  # the row now (before, for a delete)
    before: CursorRow | None = None

    def _row(self) -> CursorRow:
        assert self.row is not None
        return self.row

    @property
    def deleted(self) -> bool:
        return self.op == "d"

    @property
    def derivation(self) -> str:
        return self._row().derivation

    @property
    def watermark(self) -> int:
        return self._row().watermark

    @property
    def last_run_at(self) -> float | None:
        return self._row().last_run_at

    @property
    def last_success_at(self) -> float | None:
        return self._row().last_success_at

    @property
    def at_handled_through(self) -> float | None:
        return self._row().at_handled_through

    @property
    def last_outcome(self) -> str | None:
        return self._row().last_outcome

    @property
    def last_job_id(self) -> str | None:
        return self._row().last_job_id

    def cursor_advanced(self) -> CursorAdvanced | None:
        """The core's :class:`CursorAdvanced` when this change records a finished run.

        None for a delete, a row no run has ended on yet (``last_outcome`` null),
        or an update that did not change the run fields.
        """
        row = self._row()
        if self.deleted or row.last_outcome is None:
            return None
        b = self.before
        if b is not None and (b.last_outcome, b.last_job_id, b.last_run_at, b.watermark) == (
                row.last_outcome, row.last_job_id, row.last_run_at, row.watermark):
            return None
        finished = row.last_run_at if row.last_run_at is not None else row.updated_at or 0.0
        return CursorAdvanced(row.derivation, row.watermark, finished, row.last_outcome,
                              row.last_job_id, self.position)


@dataclass(frozen=True)
class TransactionMarker:
    """A Debezium transaction-metadata event (``<prefix>.transaction`` topic)."""

    status: Literal["BEGIN", "END"]
    id: str
    event_count: int | None = None
    data_collections: tuple[tuple[str, int], ...] = ()
    ts_ms: int | None = None


ChangeEvent = ReadyRecord | UnreadyInsert | RecordUpdate | RecordDelete | CursorAdvance
Parsed = ChangeEvent | TransactionMarker


# -- value helpers -------------------------------------------------------------


def position_of(prev_commit_lsn: int | None, lsn: int | None, snapshot: bool = False) -> int:
    """The commit-ordered position of a change (0: unknown, do not deduplicate)."""
    if snapshot or prev_commit_lsn is None or lsn is None:
        return 0
    return (prev_commit_lsn << 64) | lsn


def parse_instant(value: Any, column: str) -> float | None:
    """A ZonedTimestamp ISO string (or null) → epoch seconds."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadValue(f"{column}: expected an ISO-8601 string, got {type(value).__name__}",
                       field=column)
    try:
        dt = datetime.fromisoformat(value)
    except ValueError as exc:
        raise BadValue(f"{column}: not an ISO-8601 instant: {value[:40]!r}",
                       field=column) from exc
    if dt.tzinfo is None:
        raise BadValue(f"{column}: instant without a timezone: {value[:40]!r}", field=column)
    return (dt - _EPOCH).total_seconds()


def _json_column(value: Any, column: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = loads(value)
        except ValueError as exc:
            raise BadValue(f"{column}: not JSON text: {exc}", field=column) from exc
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadValue(f"{column}: expected a JSON object, got {type(value).__name__}",
                       field=column)
    return value


def _int(row: Mapping[str, Any], column: str, default: int | None = None,
         required: bool = False) -> Any:
    if column not in row:
        if required:
            raise MissingField(f"row has no {column!r}", field=column)
        return default
    v = row[column]
    if v is None and not required:
        return default
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadValue(f"{column}: expected an integer, got {v!r:.40}", field=column)
    return v


def _str(row: Mapping[str, Any], column: str, default: str | None = None,
         required: bool = False) -> Any:
    if column not in row:
        if required:
            raise MissingField(f"row has no {column!r}", field=column)
        return default
    v = row[column]
    if v is None and not required:
        return default
    if not isinstance(v, str):
        raise BadValue(f"{column}: expected a string, got {v!r:.40}", field=column)
    return v


def _bool(row: Mapping[str, Any], column: str) -> bool:
    v = row.get(column, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadValue(f"{column}: expected a boolean, got {v!r:.40}", field=column)
    return v


def _to_rec(row: Mapping[str, Any]) -> Rec:
    """The row as the core's :class:`Rec`; JSON columns already decoded by ``_decoded``.

    The common row (every column of its exact type) is built directly; anything else
    goes through :func:`_to_rec_checked`, which accepts the same rows and says what is
    wrong with the others."""
    g = row.get
    seq, coll, ver, typ, status = (g("seq"), g("collection"), g("collection_version"),
                                   g("type"), g("status"))
    key, text, tomb, parents = g("key"), g("text"), g("tombstone"), g("parents")
    content, annotations, scores = g("content"), g("annotations"), g("scores")
    if not (type(seq) is int and type(coll) is str
            and (ver is None or type(ver) is int) and (typ is None or type(typ) is str)
            and (status is None or type(status) is str) and (key is None or type(key) is str)
            and (text is None or type(text) is str)
            and (tomb is None or tomb is True or tomb is False)
            and (parents is None or (type(parents) is list
                                     and all(type(p) is int for p in parents)))
            and type(content) is dict and type(annotations) is dict
            and type(scores) is dict):
        return _to_rec_checked(row)
    created = parse_instant(g("created_at"), "created_at")
    return Rec(seq, coll, 1 if ver is None else ver, typ or "",
               "active" if status is None else status, key, content, text or "",
               tomb is True, annotations, scores,
               parse_instant(g("enriched_at"), "enriched_at"),
               created if created is not None else 0.0,
               tuple(parents) if parents else ())


def _to_rec_checked(row: Mapping[str, Any]) -> Rec:
    parents = row.get("parents") or []
    if not isinstance(parents, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in parents):
        raise BadValue(f"parents: expected an array of integers, got {parents!r:.60}",
                       field="parents")
    created = parse_instant(row.get("created_at"), "created_at")
    return Rec(
        seq=_int(row, "seq", required=True),
        collection=_str(row, "collection", required=True),
        version=_int(row, "collection_version", 1),
        type=_str(row, "type", ""),
        status=_str(row, "status", "active"),
        key=_str(row, "key"),
        content=_json_column(row.get("content"), "content"),
        text=_str(row, "text", ""),
        tombstone=_bool(row, "tombstone"),
        annotations=_json_column(row.get("annotations"), "annotations"),
        scores=_json_column(row.get("scores"), "scores"),
        enriched_at=parse_instant(row.get("enriched_at"), "enriched_at"),
        created_at=created if created is not None else 0.0,
        parents=tuple(parents),
    )


def _to_cursor(row: Mapping[str, Any]) -> CursorRow:
    return CursorRow(
        workspace=_str(row, "workspace", required=True),
        derivation=_str(row, "derivation", required=True),
        entity=_str(row, "entity", required=True),
        watermark=_int(row, "watermark", 0),
        last_run_at=parse_instant(row.get("last_run_at"), "last_run_at"),
        last_success_at=parse_instant(row.get("last_success_at"), "last_success_at"),
        last_run_id=_int(row, "last_run_id"),
        at_handled_through=parse_instant(row.get("at_handled_through"), "at_handled_through"),
        advance_count=_int(row, "advance_count", 0),
        updated_at=parse_instant(row.get("updated_at"), "updated_at"),
        last_outcome=_str(row, "last_outcome"),
        last_job_id=_str(row, "last_job_id"),
    )


def _decoded(table: str, row: Mapping[str, Any] | None, *,
             owned: bool = False) -> dict[str, Any] | None:
    """The row with JSON columns decoded: the change-feed document (``row`` itself,
    decoded in place, when the caller ``owned`` a copy already)."""
    if row is None:
        return None
    out = row if owned and type(row) is dict else dict(row)
    for col in _JSON_COLUMNS.get(table, ()):
        if col in out:
            out[col] = _json_column(out[col], col)
    return out


def _fill_unavailable(after: dict[str, Any], before: Mapping[str, Any] | None) -> None:
    for col, v in after.items():
        if v == UNAVAILABLE:
            if before is not None and col in before and before[col] != UNAVAILABLE:
                after[col] = before[col]
            else:
                raise BadValue(f"{col}: unchanged TOASTed value and no old row to take it "
                               "from (is REPLICA IDENTITY FULL set?)", field=col)


def _row_id(table: str, row: Mapping[str, Any]) -> str:
    if table == RECORDS:
        return str(row["seq"])
    parts = (row["workspace"], row["derivation"], row["entity"])
    return "/".join(quote(str(p), safe=":@") for p in parts)


# -- the parser ----------------------------------------------------------------


def _load(value: bytes | bytearray | memoryview | str, max_bytes: int) -> Any:
    size = len(value)
    if size > max_bytes:
        raise Oversized(f"message of {size} bytes exceeds the {max_bytes}-byte limit",
                        size=size, limit=max_bytes)
    if not isinstance(value, str):
        value = bytes(value)
        try:
            return loads(value)
        except ValueError:
            pass  # say why below, from the text
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NotJson(f"not UTF-8 text: {exc}") from exc
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        at_end = exc.pos >= len(value.rstrip())
        what = "truncated JSON" if at_end else "not JSON"
        raise NotJson(f"{what}: {exc.msg} at character {exc.pos}") from exc
    except RecursionError as exc:
        raise NotJson("JSON nested too deeply") from exc


def _source(doc: Mapping[str, Any]) -> Source:
    src = doc.get("source")
    if not isinstance(src, dict):
        raise MissingField("envelope has no 'source' object", field="source")
    table = src.get("table")
    if not isinstance(table, str) or not table:
        raise MissingField("source has no 'table'", field="source.table")
    prev = None
    seq = src.get("sequence")
    if isinstance(seq, str):
        try:
            pair = loads(seq)
            if isinstance(pair, list) and pair and pair[0] is not None:
                prev = int(pair[0])
        except (ValueError, TypeError):
            raise BadValue(f"source.sequence is not a JSON pair of LSNs: {seq[:60]!r}",
                           field="source.sequence") from None
    lsn = src.get("lsn")
    tx = src.get("txId")
    ts_us = src.get("ts_us")
    if ts_us is None and isinstance(src.get("ts_ms"), int):
        ts_us = src["ts_ms"] * 1000
    for name, v in (("lsn", lsn), ("txId", tx), ("ts_us", ts_us)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise BadValue(f"source.{name}: expected an integer, got {v!r:.40}",
                           field=f"source.{name}")
    snap = src.get("snapshot")
    if isinstance(snap, bool):  # Debezium 1.x wrote a boolean
        snap = "true" if snap else None
    return Source(table=table, schema=src.get("schema"), db=src.get("db"),
                  connector=src.get("connector"), name=src.get("name"),
                  version=src.get("version"), lsn=lsn, tx_id=tx, ts_us=ts_us,
                  snapshot=None if snap in (None, "false") else str(snap),
                  prev_commit_lsn=prev)


def _transaction(doc: Mapping[str, Any]) -> TxInfo | None:
    tx = doc.get("transaction")
    if not isinstance(tx, dict):
        return None
    try:
        return TxInfo(str(tx["id"]), int(tx["total_order"]), int(tx["data_collection_order"]))
    except (KeyError, TypeError, ValueError):
        raise BadValue("transaction block lacks id / total_order / data_collection_order",
                       field="transaction") from None


def _marker(doc: Mapping[str, Any]) -> TransactionMarker:
    collections = tuple(
        (str(c.get("data_collection")), int(c.get("event_count", 0)))
        for c in doc.get("data_collections") or () if isinstance(c, dict))
    count = doc.get("event_count")
    return TransactionMarker(doc["status"], str(doc["id"]),
                             int(count) if isinstance(count, int) else None, collections,
                             doc.get("ts_ms") if isinstance(doc.get("ts_ms"), int) else None)


def _check_key(key: bytes | str | None, workspace: str, entity: str) -> None:
    if key is None:
        return
    try:
        doc = loads(key)
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotJson(f"message key is not JSON: {exc}") from exc
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc:
        doc = doc["payload"]
    if not isinstance(doc, dict) or doc.get("workspace") != workspace or \
            doc.get("entity") != entity:
        raise BadValue(f"message key {str(doc)[:80]} does not name the row's "
                       f"(workspace, entity) = ({workspace}, {entity})", field="key")


def parse(value: bytes | bytearray | memoryview | str | Mapping[str, Any] | None,
          key: bytes | str | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES,
          tables: frozenset[str] = TABLES) -> Parsed | None:
    """Parse one change message into a typed event.

    :param value: the message value (bytes, text, or an already-decoded dict);
        None — a Kafka tombstone — returns None.
    :param key: the message key; when given it must name the row's
        (workspace, entity).
    :param max_bytes: values longer than this are :class:`Oversized`.
    :param tables: tables the caller consumes; others are :class:`UnknownTable`.
    :raises EnvelopeError: with a stable ``code`` saying why (dead-letter reason).
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        doc = value
    else:
        doc = _load(value, max_bytes)
        if _c_parse is not None and RECORDS in tables:
            # the C parser, or None for what only this function parses (or rejects)
            event = _c_parse(doc, key)
            if event is not None:
                return event  # type: ignore[no-any-return]
    if not isinstance(doc, dict):
        raise NotAnEnvelope(f"expected a JSON object, got {type(doc).__name__}")
    if "payload" in doc and "schema" in doc:  # JsonConverter with schemas.enable=true
        doc = doc["payload"]
        if not isinstance(doc, dict):
            raise NotAnEnvelope("schema-wrapped message without an object payload")
    if "op" not in doc and doc.get("status") in ("BEGIN", "END") and "id" in doc:
        return _marker(doc)
    op = doc.get("op")
    if op is None:
        raise MissingField("envelope has no 'op'", field="op")
    if not isinstance(op, str) or op not in OPS:  # (a list is not hashable)
        what = {"t": "truncate", "m": "logical message"}.get(str(op))
        raise UnknownOp(f"op {op!r}" + (f" ({what})" if what else "") +
                        " is not a change the engine consumes", op=str(op)[:20])
    source = _source(doc)
    table = source.table
    if table not in tables:
        raise UnknownTable(f"table {source.schema or '?'}.{table} is not one the engine "
                           "consumes", table=table)
    after_raw = doc.get("after", _MISSING)
    before_raw = doc.get("before", _MISSING)
    if op == "d":
        if not isinstance(before_raw, dict):
            raise MissingField("delete without a 'before' row", field="before")
        after_raw = None
    else:
        if not isinstance(after_raw, dict):
            raise MissingField(f"op {op!r} without an 'after' row", field="after")
    if before_raw is _MISSING or before_raw is None:
        before_raw = None
    elif not isinstance(before_raw, dict):
        raise BadValue("'before' is not an object", field="before")
    if after_raw is not None:
        after_raw = dict(after_raw)
        _fill_unavailable(after_raw, before_raw)
    row = after_raw if after_raw is not None else before_raw
    assert row is not None
    workspace = _str(row, "workspace", required=True)
    entity = _str(row, "entity", required=True)
    _check_key(key, workspace, entity)
    snapshot = source.is_snapshot or op == "r"
    try:
        row_id = _row_id(table, row)
    except KeyError as exc:
        raise MissingField(f"row has no {exc.args[0]!r}", field=str(exc.args[0])) from None
    # JSON columns are decoded once, here; the records below and the change-feed view
    # share the decoded dicts (both treat them as read-only).
    after_raw = _decoded(table, after_raw, owned=True)  # copied above
    before_raw = _decoded(table, before_raw)
    ts_ms = doc.get("ts_ms")
    # the fields every change carries, in _Change's order (positional: the per-change
    # constructor is on the hot path)
    common = (op, workspace, entity, source, (row_id, after_raw, before_raw),
              position_of(source.prev_commit_lsn, source.lsn, snapshot),
              ts_ms if isinstance(ts_ms, int) else None, _transaction(doc))
    if table == CURSORS:
        before_c = _to_cursor(before_raw) if before_raw is not None else None
        now_c = _to_cursor(after_raw) if after_raw is not None else before_c
        return CursorAdvance(*common, now_c, before_c if op != "d" else None)
    after = _to_rec(after_raw) if after_raw is not None else None
    before = _to_rec(before_raw) if before_raw is not None else None
    if op == "d":
        return RecordDelete(*common, None, before)
    assert after is not None
    if op in ("c", "r"):
        cls = ReadyRecord if after.ready else UnreadyInsert
        return cls(*common, after, before)
    if after.ready and (before is None or not before.ready):
        return ReadyRecord(*common, after, before, True)
    return RecordUpdate(*common, after, before)


class _Missing:
    pass


_MISSING: Final = _Missing()


#: The C parser of the common records envelope (``wakeline/core/_ccodec.c``'s
#: ``parse_record``), unless it was not built or ``WAKELINE_PURE_CODEC=1`` switches it
#: off.  :func:`parse`'s Python body is its specification and fallback.
_c_parse: Any = None
if _ccodec is not None:
    _ccodec.setup_envelope(Source, ReadyRecord, UnreadyInsert, RecordUpdate, RecordDelete, Rec,
                           orjson.loads)
    _c_parse = _ccodec.parse_record
