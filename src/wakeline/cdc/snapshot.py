"""Read the current rows of the engine's tables as Debezium ``op: r`` events.

A snapshot rebuilds stream state from PostgreSQL (invariant 1) after topic loss,
retention expiry or a memory-only broker restart.  It runs in one REPEATABLE
READ transaction, so every row comes from the same instant; tables in
:data:`~wakeline.cdc.compose.ENGINE_TABLES` order (Debezium's), rows by primary
key.  Values are read in the server's text output (no client-side parsing), so
they convert exactly like pgoutput tuples do.

Every event of one snapshot carries the snapshot's WAL position as
``source.lsn``, its transaction id as ``txId`` and its start as
``source.ts_ms``; ``source.sequence`` is ``[null, "<lsn>"]`` as in Debezium.
Consumers see ``op: r``; the envelope parser gives such events position 0 so
the core applies each (they share one LSN).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.adapt import Loader

from wakeline.cdc.compose import (
    ENGINE_TABLES,
    ColumnSpec,
    SourceTemplate,
    TableCodec,
    envelope,
    snapshot_marker,
)

#: (rows done, rows total) after each row; called from the snapshot loop.
Progress = Callable[[int, int], None]


class _RawText(Loader):
    """Keep a column's text output as ``str``: the converters parse it, not psycopg."""

    def load(self, data: Any) -> str:
        return bytes(data).decode("utf-8")


@dataclass(frozen=True)
class SnapshotEvent:
    """One row of a snapshot, ready to produce."""

    table: str
    key: bytes
    value: bytes


@dataclass
class SnapshotInfo:
    lsn: int = 0
    tx_id: int = 0
    ts_us: int = 0
    counts: dict[str, int] | None = None

    @property
    def total(self) -> int:
        return sum((self.counts or {}).values())


def table_columns(conn: psycopg.Connection[Any], schema: str, table: str) -> list[ColumnSpec]:
    """The published columns of a table, in attribute order (what pgoutput sends)."""
    rel = f"{schema}.{table}"
    pk = {r[0] for r in conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary", (rel,)).fetchall()}
    rows = conn.execute(
        "SELECT attname, atttypid::int, atttypmod FROM pg_attribute WHERE attrelid = %s::regclass "
        "AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
        (rel,)).fetchall()
    return [ColumnSpec(name, int(oid), int(mod), name in pk) for name, oid, mod in rows]


def _primary_key(conn: psycopg.Connection[Any], schema: str, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary "
        "ORDER BY array_position(i.indkey::int2[], a.attnum)", (f"{schema}.{table}",)).fetchall()
    return [r[0] for r in rows]


class Snapshot:
    """An iterator of :class:`SnapshotEvent` over the current rows.

    :param dsn: the database.
    :param source: ``source`` fields (database name, connector name).
    :param tables: tables to read, in order (default the engine's two).
    :param workspace: only rows of this workspace (all when None).
    :param chunk: rows fetched per round trip (server-side cursor).

    ``info`` is filled when iteration starts (LSN, txId, row counts).
    """

    def __init__(self, dsn: str, source: SourceTemplate, *, schema: str = "public",
                 tables: Sequence[str] = ENGINE_TABLES, workspace: str | None = None,
                 chunk: int = 2000) -> None:
        self.dsn = dsn
        self.source = source
        self.schema = schema
        self.tables = tuple(tables)
        self.workspace = workspace
        self.chunk = chunk
        self.info = SnapshotInfo()

    def __iter__(self) -> Iterator[SnapshotEvent]:
        with psycopg.connect(self.dsn) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            conn.execute("SET DateStyle = 'ISO'")
            conn.commit()
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                yield from self._read(conn)

    def _where(self) -> tuple[sql.Composable, tuple[Any, ...]]:
        if self.workspace is None:
            return sql.SQL(""), ()
        return sql.SQL(" WHERE workspace = %s"), (self.workspace,)

    def _read(self, conn: psycopg.Connection[Any]) -> Iterator[SnapshotEvent]:
        row = conn.execute(
            "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint, txid_current()").fetchone()
        assert row is not None
        self.info.lsn, self.info.tx_id = int(row[0]), int(row[1])
        self.info.ts_us = time.time_ns() // 1000
        where, params = self._where()
        codecs: list[tuple[TableCodec, list[str]]] = []
        counts: dict[str, int] = {}
        for table in self.tables:
            cols = table_columns(conn, self.schema, table)
            codecs.append((TableCodec(self.schema, table, cols),
                           _primary_key(conn, self.schema, table) or [c.name for c in cols]))
            ident = sql.Identifier(self.schema, table)
            n = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(ident) + where,
                             params).fetchone()
            counts[table] = int(n[0]) if n else 0
        self.info.counts = counts
        for t_index, (codec, pk) in enumerate(codecs):
            ident = sql.Identifier(self.schema, codec.table)
            query = (sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(n) for n in codec.names), ident)
                + where + sql.SQL(" ORDER BY {}").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in pk)))
            with conn.cursor(name=f"wakeline_snapshot_{t_index}") as cur:
                for spec in codec.columns:
                    cur.adapters.register_loader(spec.type_oid, _RawText)
                cur.itersize = self.chunk
                cur.execute(query, params)
                total = counts[codec.table]
                for r_index, values in enumerate(cur):
                    # Rows appearing after the count cannot happen in REPEATABLE READ;
                    # min() keeps the markers sane even if they did.
                    marker = snapshot_marker(t_index, len(codecs), min(r_index, total - 1),
                                             max(total, r_index + 1))
                    after = codec.row(values)
                    src = self.source.block(
                        schema=self.schema, table=codec.table, ts_us=self.info.ts_us,
                        tx_id=self.info.tx_id, lsn=self.info.lsn, prev_commit_lsn=None,
                        snapshot=marker)
                    yield SnapshotEvent(codec.table, codec.key(after),
                                        envelope("r", None, after, src))
