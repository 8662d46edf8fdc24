"""The conditions agents' per-entity state: in memory, changelogged to a compacted topic.

Each entity's :class:`~wakeline.core.state.EntityState` is kept as its stored
bytes (:func:`wakeline.core.codec.encode_state`, about 130 B) per partition, plus
a bounded set of recently used states kept decoded.  The agent applies a batch,
then :meth:`EntityStore.flush` encodes each entity the batch touched once and
produces it to the changelog topic (``<app id>-wakeline-entity-state-changelog``,
partition = the entity's partition, key = the JSON string of the state key, the
form the API's state view reads).  The agent acks its batch only after the
producer confirmed those messages, so a state is never behind what the group
committed: after a crash the next owner reloads the changelog and the events
after the last commit come again (the core drops replays by position).

Why not a Faust table: a table sends each changelog message through Faust's
producer (about 16% of the worker's time, bench/stream_throughput.py) and restores
4-8k entities/s (bench/recovery.py).  Here a message is one librdkafka
``produce`` and a reload is a plain read of the partition into a dict: no state
is decoded to reload, because each changelog value carries, ahead of the state,
what the worker needs at once: the entity's next wake-up (the time index) and
whether a run is in flight (the resync after a failover).

Value frame: ``0xF1``, a flag byte (1: a run is in flight, 2: a wake-up is set),
the wake-up as a little-endian double, then the stored state.  A value without
the frame (an older worker's) is the bare stored state.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from wakeline.core.codec import decode_state, encode_state
from wakeline.core.state import EntityState

log = logging.getLogger("wakeline.streams.statestore")

MAGIC = 0xF1
_HEAD = struct.Struct("<BBd")
_RUNNING, _WAKEUP = 1, 2


def frame(state: bytes, wakeup: float | None, running: bool) -> bytes:
    flags = (_RUNNING if running else 0) | (_WAKEUP if wakeup is not None else 0)
    return _HEAD.pack(MAGIC, flags, wakeup or 0.0) + state


def unframe(value: bytes) -> tuple[bytes, float | None, bool | None]:
    """``(stored state, wake-up, run in flight)``; for an unframed (older) value the
    last two are unknown: ``(value, None, None)``."""
    if value[:1] != b"\xf1":
        return value, None, None
    _, flags, wakeup = _HEAD.unpack_from(value)
    return value[_HEAD.size:], wakeup if flags & _WAKEUP else None, bool(flags & _RUNNING)


@dataclass
class Reloaded:
    """What a partition's reload found: entities, and those needing a timer or a resync."""

    partition: int
    entities: int
    messages: int
    seconds: float
    wakeups: list[tuple[str, float]]
    running: list[str]


class EntityStore:
    """Entity states of the partitions this worker owns.

    Not thread-safe: the conditions agent's coroutine is its only user, apart from
    :meth:`reload`, which reads the changelog in a thread into a fresh dict and
    hands it over on the event loop.

    :param meta: for a legacy (unframed) value, ``(wake-up, run in flight)`` from
        its decoded state.
    """

    def __init__(self, *, bootstrap: str, topic: str, group: str,
                 meta: Callable[[EntityState], tuple[float | None, bool]],
                 live_max: int = 4096, dirty_max: int = 4096) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.meta = meta
        self.live_max = live_max
        self.dirty_max = dirty_max
        self.parts: dict[int, dict[str, bytes]] = {}
        #: per partition, the changelog offset after the last message known to this
        #: worker (read by a reload, or written and acknowledged)
        self.end: dict[int, int] = {}
        self._recheck: set[int] = set()
        # Least recently used first.  An OrderedDict, not a dict: evicting a dict's first
        # key with next(iter(d)) scans the deleted slots before it, which made eviction
        # 7.8 % of a conditions worker's samples at 100k entities.
        self._live: OrderedDict[str, tuple[int, EntityState]] = OrderedDict()
        self._dirty: dict[str, tuple[int, EntityState, float | None, bool]] = {}
        #: states encoded before the flush (:meth:`put`), in encoding order: (key,
        #: partition, value)
        self._encoded: list[tuple[str, int, bytes]] = []
        self._loading: dict[int, asyncio.Future[Reloaded]] = {}
        self.reloads: list[Reloaded] = []
        self.produced = 0

    # -- ownership --------------------------------------------------------------------

    def owned(self) -> set[int]:
        return set(self.parts) | set(self._loading)

    def keep_only(self, partitions: Iterable[int]) -> set[int]:
        """Forget every partition not in ``partitions`` (after a rebalance); returns
        the forgotten ones.  A partition kept through a rebalance keeps its states:
        nobody else wrote them meanwhile."""
        keep = set(partitions)
        gone = self.owned() - keep
        # A kept partition is read on from where this worker's knowledge ends: if this
        # worker had been dropped from the group unawares, another one may have
        # written states since (usually the read finds nothing).
        self._recheck = keep & set(self.parts)
        for p in gone:
            self.parts.pop(p, None)
            self.end.pop(p, None)
            fut = self._loading.pop(p, None)
            if fut is not None:
                fut.cancel()
        if gone:
            self._live = OrderedDict((k, v) for k, v in self._live.items() if v[0] not in gone)
            self._dirty = {k: v for k, v in self._dirty.items() if v[0] not in gone}
            self._encoded = [e for e in self._encoded if e[1] not in gone]
        return gone

    def loading(self, partition: int, loop: asyncio.AbstractEventLoop,
                executor: Any = None) -> asyncio.Future[Reloaded] | None:
        """The reload of ``partition`` (started now if it is neither loaded nor
        loading, or kept through a rebalance and not read on since); None once
        loaded."""
        fut = self._loading.get(partition)
        if fut is not None:
            return fut
        if partition in self.parts and partition not in self._recheck:
            return None
        self._recheck.discard(partition)
        fut = self._loading[partition] = asyncio.ensure_future(
            self._reload(partition, loop, executor))
        return fut

    def written(self, partition: int, offset: int) -> None:
        """A state message of ours was acknowledged at ``offset`` (any thread)."""
        if offset + 1 > self.end.get(partition, 0):
            self.end[partition] = offset + 1

    async def _reload(self, partition: int, loop: asyncio.AbstractEventLoop,
                      executor: Any) -> Reloaded:
        kept = self.parts.get(partition)
        start = self.end.get(partition) if kept is not None else None
        data, messages, seconds, end = await loop.run_in_executor(
            executor, read_partition, self.bootstrap, self.topic, partition, self.group,
            start)
        read = data
        if kept is not None and start is not None:
            # Read on from what this worker knew: what others wrote since replaces it.
            if data:
                self._live = OrderedDict((k, v) for k, v in self._live.items()
                                         if k not in data)
            kept.update(data)
            data = kept
        # Only the states just read need a timer or a resync: those this worker kept
        # through a rebalance have their timers, and their runs' ends reach it in order.
        # (A resync for every entity with a run in flight, after each rebalance that kept
        # its partitions, was thousands of PostgreSQL queries.)
        wakeups: list[tuple[str, float]] = []
        running: list[str] = []
        for skey, value in read.items():
            _, wakeup, run = unframe(value)
            if run is None:  # an older worker's value: ask the state
                from wakeline.streams.keys import split_state_key

                wakeup, run = self.meta(decode_state(value, *split_state_key(skey)))
            if wakeup is not None:
                wakeups.append((skey, wakeup))
            if run:
                running.append(skey)
        if partition not in self._loading:
            raise asyncio.CancelledError  # revoked while reading
        self.parts[partition] = data
        self.end[partition] = max(end, self.end.get(partition, 0))
        self._loading.pop(partition, None)
        done = Reloaded(partition, len(data), messages, seconds, wakeups, running)
        self.reloads.append(done)
        return done

    # -- states ------------------------------------------------------------------------

    def get(self, partition: int, skey: str, workspace: str, entity: str) -> EntityState:
        hit = self._live.get(skey)
        if hit is not None:
            self._live.move_to_end(skey)  # most recently used last
            return hit[1]
        # Changed, then evicted from the live states before the flush encoded it: its
        # stored bytes are older than this.
        waiting = self._dirty.get(skey)
        if waiting is not None:
            return waiting[1]
        data = self.parts[partition].get(skey)
        if data is None:
            return EntityState(workspace, entity)
        return decode_state(unframe(data)[0], workspace, entity)

    def put(self, partition: int, skey: str, st: EntityState, wakeup: float | None,
            running: bool) -> None:
        """``st`` changed: it is encoded and produced by the next :meth:`flush`.

        Bounded between flushes: the live states are trimmed to ``live_max`` here, and
        once more than ``2 * dirty_max`` states wait, the oldest ``dirty_max`` are
        encoded now (stored, and queued for the flush in that order).  A conditions
        batch in a backlog touches ~13k entities; holding every one decoded until the
        flush kept ~200k more objects alive for each collection of the cyclic GC to
        scan.  An entity changed again after its state was encoded is written twice
        by that flush, the newer value last."""
        dirty = self._dirty
        dirty[skey] = (partition, st, wakeup, running)
        live = self._live
        live[skey] = (partition, st)
        live.move_to_end(skey)
        if len(live) > self.live_max:
            live.popitem(last=False)
        if len(dirty) > 2 * self.dirty_max:
            items = iter(dirty.items())
            for _ in range(self.dirty_max):
                self._encode(*next(items))
            self._dirty = dict(items)

    def _encode(self, skey: str, entry: tuple[int, EntityState, float | None, bool]) -> None:
        p, st, wakeup, running = entry
        part = self.parts.get(p)
        if part is None:
            return  # revoked meanwhile: the next owner replays the events
        value = part[skey] = frame(encode_state(st), wakeup, running)
        self._encoded.append((skey, p, value))

    def flush(self, produce: Callable[[str, bytes, int, bytes], None]) -> int:
        """Encode each state changed since the last flush, store it and hand it to
        ``produce(topic, key, partition, value)`` (first those :meth:`put` encoded
        already); returns how many.  The caller waits for the producer before acking
        the events that made them."""
        for skey, entry in self._dirty.items():
            self._encode(skey, entry)
        self._dirty.clear()
        # Each was encoded for a partition held then, and a revocation since (keep_only)
        # took its entries out.
        encoded, self._encoded = self._encoded, []
        topic, dumps = self.topic, orjson.dumps
        for skey, p, value in encoded:
            produce(topic, dumps(skey), p, value)
        live = self._live
        while len(live) > self.live_max:
            live.popitem(last=False)
        self.produced += len(encoded)
        return len(encoded)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts.values())


def read_partition(bootstrap: str, topic: str, partition: int, group: str,
                   start: int | None = None) -> tuple[dict[str, bytes], int, float, int]:
    """The latest value of every key of one changelog partition, read from ``start``
    (default: its beginning) to its end (``enable.partition.eof``: the end the
    broker reports in the fetch that reached it); ``(data, messages read, seconds,
    end offset)``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    t0 = time.perf_counter()
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest", "log_level": 3,
        "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "queued.max.messages.kbytes": 256 * 1024, "fetch.wait.max.ms": 10,
    })
    data: dict[str, bytes] = {}
    n = 0
    loads = orjson.loads
    try:
        # Offset 0, not OFFSET_BEGINNING: resolving the latter took 0.5 s on Tansu; where
        # compaction or retention removed offset 0, auto.offset.reset=earliest applies.
        consumer.assign([TopicPartition(topic, partition, start or 0)])
        end = start or 0
        while True:
            # librdkafka's batch consume waits its whole timeout for a full batch: keep
            # it short, the loop ends at the partition's end anyway
            msgs = consumer.consume(20000, 0.02)
            eof = False
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof = True
                        end = max(end, m.offset())
                        continue
                    if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        return data, n, time.perf_counter() - t0, end  # never written yet
                    raise RuntimeError(f"reading {topic}[{partition}]: {err}")
                key = m.key()
                if key is None:
                    continue
                value = m.value()
                end = m.offset() + 1
                skey = loads(key)
                if value is None:
                    data.pop(skey, None)
                else:
                    data[skey] = value
                n += 1
            if eof:
                return data, n, time.perf_counter() - t0, end
    finally:
        consumer.close()
