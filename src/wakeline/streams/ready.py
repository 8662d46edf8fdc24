"""Ready batches: the readiness stage's hand-off to the conditions agents.

The readiness stage (:mod:`wakeline.streams.readiness`) reads the change topic,
parses each envelope once, dead-letters what does not parse, enriches unready
records, and writes the core's events of a run of consecutive change messages of
partition *p* as ONE message on partition *p* of the ready topic.  The conditions
agent (a Faust agent) then pays Faust's per-event cost once per batch instead of
once per change (a bare Faust agent handles 6-12k events/s on this machine;
``BENCHMARKS.md``), and never parses an envelope.

Order: a batch holds its partition's changes in offset order and batches follow
each other in offset order; an entity's events stay on one partition (invariant
3).  After a readiness failover a range may be written twice; batches carry the
source offsets so the agent skips what it already applied, and the core drops
replays by position (``lsn``) anyway.

Wire form (JSON via orjson)::

    {"v": 1, "p": partition, "first": offset, "last": offset, "t": ms,
     "items": [[key, workspace, entity, offset, event, ...], ...]}

``t`` (optional): the commit time (ms, ``source.ts_us``) of the newest change in
the batch, or, for changes without one, its broker timestamp, so the conditions
agent measures how far behind PostgreSQL it is (the CDC path's, readiness's and its
own backlogs together; ``streams.app.event_times``).

with events ``["r", op, after, before, lsn_hi, lsn_lo]`` (:class:`RecordChanged`,
records as positional lists) and ``["a", derivation, watermark, finished_at,
outcome, job_id, lsn_hi, lsn_lo]`` (:class:`CursorAdvanced`).  Positions are
128-bit (``prev commit lsn << 64 | lsn``) and travel as two 64-bit halves.

:func:`decode` builds the Items in C (``_ccodec.ready_items``) when it was built;
:func:`decode_items` is its specification and reads (or rejects) whatever it leaves.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from wakeline.core import codec
from wakeline.core.events import CursorAdvanced, Event, RecordChanged
from wakeline.core.plan import Rec

VERSION = 1
_MASK64 = (1 << 64) - 1


class BadBatch(ValueError):
    """A ready-topic message that is not a batch of this version."""

    code = "stream.bad_ready_batch"


@dataclass(frozen=True, slots=True)
class Item:
    """One change message's events, as the conditions agent applies them."""

    key: bytes
    workspace: str
    entity: str
    offset: int
    events: list[Event]


def _rec(r: Rec | None) -> list[Any] | None:
    if r is None:
        return None
    return [r.seq, r.collection, r.version, r.type, r.status, r.key, r.content, r.text,
            r.tombstone, r.annotations, r.scores, r.enriched_at, r.created_at, r.parents]


def _unrec(v: list[Any] | None) -> Rec | None:
    if v is None:
        return None
    v[13] = tuple(v[13])
    return Rec(*v)


def _event(e: Event) -> list[Any]:
    if isinstance(e, RecordChanged):
        return ["r", e.op, _rec(e.after), _rec(e.before), e.lsn >> 64, e.lsn & _MASK64]
    if isinstance(e, CursorAdvanced):
        return ["a", e.derivation, e.watermark, e.finished_at, e.outcome, e.job_id,
                e.lsn >> 64, e.lsn & _MASK64]
    raise TypeError(f"not a change event: {type(e).__name__}")


def _unevent(v: list[Any]) -> Event:
    if v[0] == "r":
        return RecordChanged(v[1], _unrec(v[2]), _unrec(v[3]), (v[4] << 64) | v[5])
    if v[0] == "a":
        return CursorAdvanced(v[1], v[2], v[3], v[4], v[5], (v[6] << 64) | v[7])
    raise BadBatch(f"unknown event tag {v[0]!r}")


def encode(partition: int, items: Sequence[Item], sent_ms: int | None = None) -> bytes:
    """One batch message; ``items`` in offset order; ``sent_ms``: the commit time (or
    broker timestamp) of its newest change, if known."""
    doc: dict[str, Any] = {"v": VERSION, "p": partition, "first": items[0].offset,
                           "last": items[-1].offset}
    if sent_ms is not None:
        doc["t"] = sent_ms
    doc["items"] = [[i.key.decode(), i.workspace, i.entity, i.offset,
                     *(_event(e) for e in i.events)] for i in items]
    try:
        return orjson.dumps(doc)
    except (TypeError, orjson.JSONEncodeError):
        # Record contents orjson cannot write (integers beyond 64 bits) go as Python
        # writes them; decode() reads both.
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def decode(value: bytes) -> tuple[int, list[Item], float | None]:
    """``(partition, items, sent)`` of a batch message, ``sent`` the commit time (s) of
    its newest change (or its broker time) or None; :class:`BadBatch` if it is none."""
    from wakeline.cdc._json import loads

    try:
        doc = loads(value)
        if doc.get("v") != VERSION:
            raise BadBatch(f"ready batch version {doc.get('v')!r}, expected {VERSION}")
        t = doc.get("t")
        if t is not None and not isinstance(t, int):
            raise BadBatch(f"ready batch timestamp {t!r} is not an integer (ms)")
        items = _c_items(doc["items"]) if _c_items is not None else None
        if items is None:  # no C side, or a shape only decode_items reads (or rejects)
            items = decode_items(doc["items"])
        return (doc["p"], items, None if t is None else t / 1000.0)
    except BadBatch:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise BadBatch(f"malformed ready batch: {type(exc).__name__}: {exc}") from exc


def decode_items(items: Any) -> list[Item]:
    """The Items of a batch's ``items`` array: the specification of the C decoder."""
    return [Item(i[0].encode(), i[1], i[2], i[3], [_unevent(e) for e in i[4:]]) for i in items]


def chunks(items: Sequence[Item], sizes: Sequence[int], *, max_items: int = 1000,
           max_bytes: int = 256 * 1024) -> Iterable[Sequence[Item]]:
    """Consecutive runs of items, each of at most ``max_items`` items and, counting
    ``sizes`` (the items' envelope bytes, larger than their decoded form), at most
    ``max_bytes`` unless a single item is larger: a batch stays under the broker's
    message size limit whenever its changes did."""
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_items or total + size > max_bytes):
            yield items[start:i]
            start, total = i, 0
        total += size
    if start < len(items):
        yield items[start:]


#: The C item decoder (``wakeline/core/_ccodec.c``), unless it was not built or
#: ``WAKELINE_PURE_CODEC=1`` switches it off.
_c_items: Any = None
if codec._ccodec is not None:
    codec._ccodec.setup_ready(Item, RecordChanged, Rec, CursorAdvanced)
    _c_items = codec._ccodec.ready_items
