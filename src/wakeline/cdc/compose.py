"""Write Debezium change envelopes: what the relay puts on the topic.

The layout follows Debezium 3.4.3's PostgreSQL connector with Kafka Connect's
JsonConverter (schemas disabled), field for field and in the same order::

    key   {"workspace":…,"entity":…}
    value {"before":…,"after":…,
           "source":{"version","connector":"postgresql","name","ts_ms","snapshot",
                     "db","sequence","ts_us","ts_ns","schema","table","txId","lsn","xmin"},
           "transaction":null,"op":"c|u|d|r","ts_ms","ts_us","ts_ns"}

``source.ts_*`` is the commit time (the snapshot's start for ``op: r``),
``source.snapshot`` is null while streaming and ``first`` / ``true`` /
``first_in_data_collection`` / ``last_in_data_collection`` / ``last`` in a
snapshot; ``source.sequence`` is ``[<end LSN of the previous commit>, <lsn>]``
as a JSON string.  The top-level ``ts_*`` is when the event was written.

Column values come from :mod:`wakeline.cdc.values`.  A TOASTed column an UPDATE
left unchanged is taken from the old row (REPLICA IDENTITY FULL has it), which
is what Debezium does too; without an old row it becomes Debezium's
``__debezium_unavailable_value`` placeholder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from wakeline import __version__
from wakeline.cdc._json import dumpb
from wakeline.cdc.pgoutput import UNCHANGED_TOAST, Value
from wakeline.cdc.values import converter_for

#: The two tables the engine consumes, in Debezium's snapshot order.
ENGINE_TABLES: Final = ("records", "derivation_cursors")
#: The message key of every engine table: one partition per (workspace, entity).
KEY_COLUMNS: Final[Mapping[str, tuple[str, ...]]] = {
    "records": ("workspace", "entity"),
    "derivation_cursors": ("workspace", "entity"),
}
UNAVAILABLE_VALUE: Final = "__debezium_unavailable_value"
RELAY_VERSION: Final = f"wakeline-relay-{__version__}"


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type_oid: int
    typmod: int = -1
    key: bool = False  # part of the replica identity / primary key


class TableCodec:
    """Turns one table's text tuples into Debezium row objects and message keys."""

    def __init__(self, schema: str, table: str, columns: Sequence[ColumnSpec],
                 key_columns: Sequence[str] | None = None) -> None:
        self.schema = schema
        self.table = table
        self.columns = tuple(columns)
        self.names = tuple(c.name for c in self.columns)
        self._convs: tuple[Callable[[str | None], Any], ...] = tuple(
            converter_for(c.type_oid, c.typmod) for c in self.columns)
        wanted = tuple(key_columns or KEY_COLUMNS.get(table)
                       or [c.name for c in self.columns if c.key])
        missing = [k for k in wanted if k not in self.names]
        if missing:
            from wakeline.cdc.errors import RelayError

            raise RelayError(f"table {schema}.{table} has no key column(s) {missing}",
                             table=table)
        self.key_columns = wanted

    def row(self, values: Sequence[Value], old: Sequence[Value] | None = None) -> dict[str, Any]:
        """The Debezium ``after`` / ``before`` object of a tuple."""
        out: dict[str, Any] = {}
        for i, (name, conv) in enumerate(zip(self.names, self._convs, strict=True)):
            v = values[i]
            if v is UNCHANGED_TOAST:
                prior = old[i] if old is not None else UNCHANGED_TOAST
                out[name] = UNAVAILABLE_VALUE if prior is UNCHANGED_TOAST else conv(prior)  # type: ignore[arg-type]
            else:
                out[name] = conv(v)  # type: ignore[arg-type]
        return out

    def key(self, row: Mapping[str, Any]) -> bytes:
        """The message key: the key columns as compact JSON, in key-column order."""
        return dumpb({k: row[k] for k in self.key_columns})


@dataclass(frozen=True)
class SourceTemplate:
    """The connector-level part of ``source``: who wrote the event, from which database."""

    db: str
    name: str = "wakeline"
    version: str = RELAY_VERSION

    def block(self, *, schema: str, table: str, ts_us: int, tx_id: int | None, lsn: int,
              prev_commit_lsn: int | None, snapshot: str | None) -> dict[str, Any]:
        return {
            "version": self.version,
            "connector": "postgresql",
            "name": self.name,
            "ts_ms": ts_us // 1000,
            "snapshot": snapshot,
            "db": self.db,
            # dumps([prev or None, lsn]) of two integers as strings, written directly
            "sequence": (f'["{prev_commit_lsn:d}","{lsn:d}"]' if prev_commit_lsn is not None
                         else f'[null,"{lsn:d}"]'),
            "ts_us": ts_us,
            "ts_ns": ts_us * 1000,
            "schema": schema,
            "table": table,
            "txId": tx_id,
            "lsn": lsn,
            "xmin": None,
        }


def envelope(op: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None,
             source: Mapping[str, Any], now_ns: int | None = None) -> bytes:
    """The message value of one change."""
    ns = time.time_ns() if now_ns is None else now_ns
    return dumpb({"before": before, "after": after, "source": source, "transaction": None,
                  "op": op, "ts_ms": ns // 1_000_000, "ts_us": ns // 1000, "ts_ns": ns})


def snapshot_marker(table_index: int, table_count: int, row_index: int, row_count: int) -> str:
    """Debezium's ``source.snapshot`` for one snapshot row."""
    first_table, last_table = table_index == 0, table_index == table_count - 1
    first_row, last_row = row_index == 0, row_index == row_count - 1
    if last_row and last_table:
        return "last"
    if first_row and first_table:
        return "first"
    if last_row:
        return "last_in_data_collection"
    if first_row:
        return "first_in_data_collection"
    return "true"
