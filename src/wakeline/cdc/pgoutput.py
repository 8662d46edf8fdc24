"""Decoder of PostgreSQL's ``pgoutput`` logical replication messages (protocol 1).

The relay reads them through SQL (``pg_logical_slot_peek_binary_changes``), one
message per row; :func:`decode` turns the ``data`` bytes of a row into one of
the dataclasses below.  Tuple data is text format (the relay never asks for
``binary``): every column value is the type's text output, ``None`` for SQL
NULL, or :data:`UNCHANGED_TOAST` when an UPDATE left a TOASTed value alone.

Message layouts (all integers big-endian, strings NUL-terminated), from the
PostgreSQL "Logical Replication Message Formats" chapter:

=======  ==================================================================
``B``    Begin: final (commit) LSN int64, commit time int64 (µs since
         2000-01-01), xid int32
``C``    Commit: flags int8, commit LSN int64, end LSN int64, commit time int64
``O``    Origin: commit LSN int64, name string
``R``    Relation: oid int32, namespace string, name string, replica
         identity int8, ncols int16, per column (flags int8, name string,
         type oid int32, typmod int32)
``Y``    Type: oid int32, namespace string, name string
``I``    Insert: relation oid int32, ``N``, tuple
``U``    Update: relation oid int32, optional ``K``/``O`` + old tuple, ``N`` + tuple
``D``    Delete: relation oid int32, ``K``/``O`` + old tuple
``T``    Truncate: nrelations int32, options int8, relation oids int32...
``M``    Message (``messages 'true'``): flags int8, LSN int64, prefix string,
         length int32, content
=======  ==================================================================

Pure functions; no I/O.  Anything that does not decode raises
:class:`~wakeline.cdc.errors.PgOutputError` naming the message type and offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from wakeline.cdc.errors import PgOutputError

#: Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
PG_EPOCH_US: Final = 946_684_800_000_000


class _Unchanged:
    """Marker of a TOASTed column an UPDATE did not change (tuple kind ``u``)."""

    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _Unchanged()

#: One column value of a tuple: text, NULL, or the unchanged-TOAST marker.
Value = str | None | _Unchanged


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    key: bool


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_time_us: int  # Unix epoch microseconds
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int  # Unix epoch microseconds


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    #: ``'O'`` whole old row (REPLICA IDENTITY FULL), ``'K'`` key columns only, or None.
    old_kind: str | None
    old: tuple[Value, ...] | None
    new: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old_kind: str
    old: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


PgOutputMessage = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | Message
)

_I8 = struct.Struct(">b").unpack_from
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_U32 = struct.Struct(">I").unpack_from
_I64 = struct.Struct(">q").unpack_from
_BEGIN = struct.Struct(">qqI").unpack_from
_COMMIT = struct.Struct(">bqqq").unpack_from


def _string(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(0, pos)
    return data[pos:end].decode("utf-8"), end + 1


def _tuple(data: bytes, pos: int) -> tuple[tuple[Value, ...], int]:
    (ncols,) = _I16(data, pos)
    pos += 2
    values: list[Value] = []
    append = values.append
    for _ in range(ncols):
        kind = data[pos]
        pos += 1
        if kind == 0x74:  # 't'
            (length,) = _I32(data, pos)
            pos += 4
            end = pos + length
            if end > len(data):
                raise IndexError("tuple value runs past the message")
            append(data[pos:end].decode("utf-8"))
            pos = end
        elif kind == 0x6E:  # 'n'
            append(None)
        elif kind == 0x75:  # 'u'
            append(UNCHANGED_TOAST)
        elif kind == 0x62:  # 'b'
            raise PgOutputError("binary tuple data: the relay asks for text format only")
        else:
            raise PgOutputError(f"unknown tuple column kind {kind!r}")
    return tuple(values), pos


def _decode(data: bytes) -> PgOutputMessage:
    tag = data[0]
    if tag == 0x42:  # B
        final_lsn, ts, xid = _BEGIN(data, 1)
        return Begin(final_lsn, ts + PG_EPOCH_US, xid)
    if tag == 0x43:  # C
        flags, commit_lsn, end_lsn, ts = _COMMIT(data, 1)
        return Commit(flags, commit_lsn, end_lsn, ts + PG_EPOCH_US)
    if tag == 0x49:  # I
        (rel,) = _U32(data, 1)
        if data[5] != 0x4E:
            raise PgOutputError(f"insert: expected 'N', got {data[5:6]!r}")
        new, _ = _tuple(data, 6)
        return Insert(rel, new)
    if tag == 0x55:  # U
        (rel,) = _U32(data, 1)
        pos = 5
        old_kind: str | None = None
        old: tuple[Value, ...] | None = None
        if data[pos] in (0x4B, 0x4F):  # K, O
            old_kind = chr(data[pos])
            old, pos = _tuple(data, pos + 1)
        if data[pos] != 0x4E:
            raise PgOutputError(f"update: expected 'N', got {data[pos:pos + 1]!r}")
        new, _ = _tuple(data, pos + 1)
        return Update(rel, old_kind, old, new)
    if tag == 0x44:  # D
        (rel,) = _U32(data, 1)
        kind = data[5]
        if kind not in (0x4B, 0x4F):
            raise PgOutputError(f"delete: expected 'K' or 'O', got {data[5:6]!r}")
        old, _ = _tuple(data, 6)
        return Delete(rel, chr(kind), old)
    if tag == 0x52:  # R
        (oid,) = _U32(data, 1)
        namespace, pos = _string(data, 5)
        name, pos = _string(data, pos)
        ident = chr(data[pos])
        (ncols,) = _I16(data, pos + 1)
        pos += 3
        cols = []
        for _ in range(ncols):
            flags = data[pos]
            cname, pos = _string(data, pos + 1)
            (type_oid,) = _U32(data, pos)
            (typmod,) = _I32(data, pos + 4)
            pos += 8
            cols.append(Column(cname, type_oid, typmod, bool(flags & 1)))
        return Relation(oid, namespace, name, ident, tuple(cols))
    if tag == 0x59:  # Y
        (oid,) = _U32(data, 1)
        namespace, pos = _string(data, 5)
        name, _ = _string(data, pos)
        return Type(oid, namespace, name)
    if tag == 0x4F:  # O
        (lsn,) = _I64(data, 1)
        name, _ = _string(data, 9)
        return Origin(lsn, name)
    if tag == 0x54:  # T
        (n,) = _I32(data, 1)
        options = data[5]
        oids = struct.unpack_from(f">{n}I", data, 6)
        return Truncate(tuple(oids), bool(options & 1), bool(options & 2))
    if tag == 0x4D:  # M
        flags = data[1]
        (lsn,) = _I64(data, 2)
        prefix, pos = _string(data, 10)
        (length,) = _I32(data, pos)
        return Message(bool(flags & 1), lsn, prefix, bytes(data[pos + 4:pos + 4 + length]))
    raise PgOutputError(f"unknown pgoutput message type {chr(tag)!r}")


def decode(data: bytes) -> PgOutputMessage:
    """Decode one pgoutput message.

    :raises PgOutputError: unknown type, truncated or malformed message.
    """
    if not data:
        raise PgOutputError("empty pgoutput message")
    try:
        return _decode(data)
    except PgOutputError:
        raise
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise PgOutputError(
            f"malformed pgoutput {chr(data[0])!r} message ({len(data)} bytes): {exc}",
            message_type=chr(data[0]),
        ) from exc
