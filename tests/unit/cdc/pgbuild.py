"""Build pgoutput protocol-1 messages byte by byte (the format PostgreSQL sends)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from wakeline.cdc.pgoutput import PG_EPOCH_US

Val = str | None | bytes  # bytes b"u": unchanged TOAST


def _s(text: str) -> bytes:
    return text.encode() + b"\x00"


def tuple_data(values: Sequence[Val]) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == b"u":
            out += b"u"
        else:
            raw = v.encode() if isinstance(v, str) else v
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


def begin(final_lsn: int, commit_us: int, xid: int) -> bytes:
    return b"B" + struct.pack(">qqI", final_lsn, commit_us - PG_EPOCH_US, xid)


def commit(commit_lsn: int, end_lsn: int, commit_us: int) -> bytes:
    return b"C" + struct.pack(">bqqq", 0, commit_lsn, end_lsn, commit_us - PG_EPOCH_US)


def relation(oid: int, namespace: str, name: str,
             columns: Sequence[tuple[str, int, int, bool]], ident: str = "f") -> bytes:
    out = b"R" + struct.pack(">I", oid) + _s(namespace) + _s(name) + ident.encode()
    out += struct.pack(">h", len(columns))
    for cname, type_oid, typmod, key in columns:
        out += bytes([1 if key else 0]) + _s(cname) + struct.pack(">Ii", type_oid, typmod)
    return out


def insert(oid: int, values: Sequence[Val]) -> bytes:
    return b"I" + struct.pack(">I", oid) + b"N" + tuple_data(values)


def update(oid: int, old: Sequence[Val] | None, new: Sequence[Val], kind: bytes = b"O") -> bytes:
    out = b"U" + struct.pack(">I", oid)
    if old is not None:
        out += kind + tuple_data(old)
    return out + b"N" + tuple_data(new)


def delete(oid: int, old: Sequence[Val], kind: bytes = b"O") -> bytes:
    return b"D" + struct.pack(">I", oid) + kind + tuple_data(old)


def truncate(oids: Sequence[int], options: int = 0) -> bytes:
    return b"T" + struct.pack(">ib", len(oids), options) + struct.pack(f">{len(oids)}I", *oids)


def message(lsn: int, prefix: str, content: bytes, transactional: bool = False) -> bytes:
    return (b"M" + bytes([1 if transactional else 0]) + struct.pack(">q", lsn) + _s(prefix)
            + struct.pack(">i", len(content)) + content)


def type_msg(oid: int, namespace: str, name: str) -> bytes:
    return b"Y" + struct.pack(">I", oid) + _s(namespace) + _s(name)


def origin(lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">q", lsn) + _s(name)


# The records table as pgoutput describes it (migrations 0001 + 0003 column order).
RECORD_COLUMNS: list[tuple[str, int, int, bool]] = [
    ("seq", 20, -1, True), ("workspace", 25, -1, True), ("entity", 25, -1, True),
    ("collection", 25, -1, True), ("collection_version", 23, -1, True), ("type", 25, -1, True),
    ("status", 25, -1, True), ("key", 25, -1, True), ("content", 3802, -1, True),
    ("text", 25, -1, True), ("tombstone", 16, -1, True), ("parents", 1016, -1, True),
    ("annotations", 3802, -1, True), ("scores", 3802, -1, True),
    ("enriched_at", 1184, -1, True), ("created_at", 1184, -1, True),
    ("produced_by_run", 20, -1, True),
]
CURSOR_COLUMNS: list[tuple[str, int, int, bool]] = [
    ("workspace", 25, -1, True), ("derivation", 25, -1, True), ("entity", 25, -1, True),
    ("watermark", 20, -1, True), ("last_run_at", 1184, -1, True),
    ("last_success_at", 1184, -1, True), ("last_run_id", 20, -1, True),
    ("at_handled_through", 1184, -1, True), ("advance_count", 20, -1, True),
    ("updated_at", 1184, -1, True), ("last_outcome", 25, -1, True),
    ("last_job_id", 25, -1, True),
]


def record_values(seq: int, entity: str = "user:mia", *, ready: bool = False,
                  content: str = '{"k": "v"}', key: str | None = None,
                  text: str = "t") -> list[Val]:
    return [str(seq), "w", entity, "main", "1", "", "active", key, content, text, "f", "{1,2}",
            "{}", "{}", "2026-01-02 03:04:05.5+00" if ready else None,
            "2026-01-02 03:04:05+00", None]
