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
:func:`encode` builds the ``items`` array in C (``_ccodec.ready_doc``), and
:func:`encode_items` is its specification, for whatever C leaves.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
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


@dataclass(slots=True)  # not frozen: one per change, and a frozen init costs ~4x (0.58 vs 0.16 us)
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
    arr = _c_doc(items) if _c_doc is not None else None
    doc["items"] = arr if arr is not None else encode_items(items)
    try:
        return orjson.dumps(doc)
    except (TypeError, orjson.JSONEncodeError):
        # Record contents orjson cannot write (integers beyond 64 bits) go as Python
        # writes them; decode() reads both.
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def encode_items(items: Sequence[Item]) -> list[list[Any]]:
    """A batch's ``items`` array: the specification of the C writer (``ready_doc``)."""
    return [[i.key.decode(), i.workspace, i.entity, i.offset, *(_event(e) for e in i.events)]
            for i in items]


def decode(value: bytes, handoff: Handoff | None = None
           ) -> tuple[int, list[Item], float | None]:
    """``(partition, items, sent)`` of a batch message, ``sent`` the commit time (s) of
    its newest change (or its broker time) or None; :class:`BadBatch` if it is none.
    ``handoff``: this process's readiness stage's batches; one it wrote with exactly
    these bytes comes back as the Items it encoded them from, not decoded again."""
    if handoff is not None:
        got = handoff.take(value)
        if got is not None:
            return got
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
        return (doc["p"], items, _seconds(t))
    except BadBatch:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise BadBatch(f"malformed ready batch: {type(exc).__name__}: {exc}") from exc


def _seconds(ms: int | None) -> float | None:
    """A batch's ``t`` (ms) as the ``sent`` instant :func:`decode` returns (s)."""
    return None if ms is None else ms / 1000.0


def decode_items(items: Any) -> list[Item]:
    """The Items of a batch's ``items`` array: the specification of the C decoder."""
    return [Item(i[0].encode(), i[1], i[2], i[3], [_unevent(e) for e in i[4:]]) for i in items]


class Handoff:
    """The ready batches this process's readiness stage wrote for partitions its own
    conditions agent reads, kept by their exact bytes with the Items they encode.

    With both roles in one process, the agent would otherwise decode every batch the
    readiness thread had just encoded from Items it held (``orjson`` and one object
    per value again: ~7 % of such a worker's busy CPU, py-spy, BENCHMARKS.md).  The
    ready topic stays the hand-off of record — batches are written, offsets committed,
    replays and other workers read it as before — and :func:`decode` of a message
    whose bytes equal a kept batch returns that batch's Items, which are what decoding
    those bytes gives (``decode(encode(items)) == items``, tests/unit/test_ready_handoff.py).

    Bounded, and never in the readiness stage's way: at most ``max_changes`` changes
    are kept (~1.4 KB each decoded); a batch that does not fit is not kept, and the
    agent decodes it as before.  A kept batch not taken within ``max_age_s`` (the
    agent lost the partition, or already had those offsets) is dropped.  In a backlog
    the readiness stage runs ahead of the agent and only what fits is handed over;
    kept at the agent's pace instead, smaller takes coalesced fewer state writes
    (2026-12-06, bench/stream_throughput.py: 164k-173k against 108k-168k).
    Thread-safe: the readiness thread puts, the agent's thread takes."""

    def __init__(self, max_changes: int = 20_000, max_age_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_changes, self.max_age_s, self._clock = max_changes, max_age_s, clock
        self._lock = threading.Lock()
        #: bytes -> (partition, items, sent, put at); insertion order is age order
        self._kept: dict[bytes, tuple[int, list[Item], float | None, float]] = {}
        self._changes = 0
        #: ready partitions the local conditions agent reads (its assignment)
        self.owned: frozenset[int] = frozenset()
        #: batches kept, taken by the agent, dropped unused, and not kept (no room)
        self.kept = self.taken = self.dropped = self.full = 0

    def wants(self, partition: int) -> bool:
        return partition in self.owned

    def own(self, partitions: Iterable[int]) -> None:
        """The agent's ready partitions now; what was kept for others is dropped."""
        with self._lock:
            self.owned = frozenset(partitions)
            for value, (p, items, _sent, _at) in list(self._kept.items()):
                if p not in self.owned:
                    self._drop(value, items)

    def put(self, value: bytes, partition: int, items: list[Item],
            sent_ms: int | None) -> bool:
        """Keep a batch about to be produced, ``value`` being ``encode(partition, items,
        sent_ms)``; False when there is no room for it."""
        with self._lock:
            if self._kept and self._changes + len(items) > self.max_changes:
                limit = self._clock() - self.max_age_s
                for old, (_p, old_items, _sent, at) in list(self._kept.items()):
                    if at > limit:
                        break
                    self._drop(old, old_items)
                if self._kept and self._changes + len(items) > self.max_changes:
                    self.full += 1
                    return False
            if value in self._kept:  # the same bytes twice: one entry serves both
                return True
            self._kept[value] = (partition, items, _seconds(sent_ms), self._clock())
            self._changes += len(items)
            self.kept += 1
            return True

    def take(self, value: bytes) -> tuple[int, list[Item], float | None] | None:
        with self._lock:
            got = self._kept.pop(value, None)
            if got is None:
                return None
            self._changes -= len(got[1])
            self.taken += 1
        return got[0], got[1], got[2]

    def _drop(self, value: bytes, items: list[Item]) -> None:
        del self._kept[value]
        self._changes -= len(items)
        self.dropped += 1

    def __len__(self) -> int:
        return len(self._kept)


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


#: The C item decoder and writer (``wakeline/core/_ccodec.c``), unless it was not built
#: or ``WAKELINE_PURE_CODEC=1`` switches it off.
_c_items: Any = None
_c_doc: Any = None
if codec._ccodec is not None:
    codec._ccodec.setup_ready(Item, RecordChanged, Rec, CursorAdvanced)
    _c_items = codec._ccodec.ready_items
    _c_doc = codec._ccodec.ready_doc
