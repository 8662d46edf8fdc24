"""Offset continuity for the agents.

Faust (0.15) can skip messages around a rebalance. Measured on Apache Kafka 4.x
with two conditions workers (tests/integration/test_streaming_rebalance.py, with
``WAKELINE_TRACE=1``), about one run in three lost one or more messages this way:

- the fetcher's records are dropped when flow control stops mid-batch, or for a
  partition that is briefly outside the consumer's active set. The client's
  position has already moved past them. The next batch starts later, and Faust
  records the jump as a *gap*: it counts the missing offsets as done and commits
  past them. The missing change events never reach the conditions agent, and the
  entity waits forever for a record it never saw.
- the same drop on a table's changelog partition during recovery: the client's
  position reaches the end, Faust's recovery offset stays at -1, and recovery
  (and every stream partition it paused) waited forever.  The agents no longer
  keep Faust tables (wakeline.streams.statestore reads its changelog itself).

The topics these agents read are neither compacted nor transactional, so a
partition's offsets are contiguous. :class:`OffsetGuard` checks, per partition,
that each event is the one after the last it let through. The first event after
an assignment must be the committed offset; where Faust does not know it yet the
broker is asked, and a partition never committed starts at its beginning (where
``auto.offset.reset=earliest`` starts), never at whatever offset happens to
arrive first: that was how stimuli were lost at a failover (bench/recovery.py
``--no-commit-wait``). On a jump it seeks the partition
back and lets nothing through until the missing offset arrives. Offsets already
let through are duplicates from such a seek and are skipped. Every seek is
counted and logged.

"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("wakeline.streams.guard")

#: Seconds before a seek for the same missing offset is repeated (the first may be
#: lost to another rebalance).
RESEEK_AFTER = 2.0


@dataclass
class OffsetGuard:
    """Per-partition next expected offset of one agent's stream."""

    name: str
    topics: frozenset[str] = frozenset()
    expected: dict[Any, int] = field(default_factory=dict)
    admitted_at: dict[Any, float] = field(default_factory=dict)
    seeking: dict[Any, tuple[int, float]] = field(default_factory=dict)
    stale: dict[Any, int] = field(default_factory=dict)  # expected when last revoked
    resolved: dict[Any, int] = field(default_factory=dict)  # baselines asked of the broker
    seeks: int = 0
    duplicates: int = 0  # at or below an offset already let through
    ahead: int = 0  # past the missing offset while a seek for it is on its way

    def forget(self, tps: Any) -> None:
        """Partitions revoked: their next owner (maybe us again) starts at the commit.

        Where we own a partition again and its committed offset is not known yet
        when the first message arrives (Faust can resume fetching before it seeks to
        the commit), the offset after the last we let through is the fallback: a
        seek back to it at worst replays what another owner did in between, which
        the core drops as duplicates."""
        for tp in tps:
            want = self.expected.pop(tp, None)
            if want is not None:
                self.stale[tp] = want
            self.seeking.pop(tp, None)
            self.admitted_at.pop(tp, None)
            self.resolved.pop(tp, None)

    def baseline(self, tp: Any, committed: int | None) -> int | None:
        """The first offset due on ``tp`` since its assignment, when known without
        asking the broker: Faust's committed offset, else one the broker gave."""
        if committed is not None and committed >= 0:
            return committed
        return self.resolved.get(tp)

    def admit(self, tp: Any, offset: int, committed: int | None
              ) -> tuple[str, int | None]:
        """``("ok", None)``, ``("dup", None)`` or ``("seek", offset_to_seek_to)``.

        ``committed`` is the partition's first offset due since its assignment (see
        :func:`first_due`); with none known the partition's beginning, 0, is due."""
        want = self.expected.get(tp)
        if want is None:
            known = self.baseline(tp, committed)
            want = 0 if known is None else known
        if offset == want:
            self.expected[tp] = offset + 1
            self.seeking.pop(tp, None)
            self.admitted_at[tp] = time.monotonic()
            return "ok", None
        if offset < want:
            self.duplicates += 1
            return "dup", None
        self.expected[tp] = want
        pending = self.seeking.get(tp)
        now = time.monotonic()
        if pending is not None and pending[0] == want and now - pending[1] < RESEEK_AFTER:
            self.ahead += 1  # already seeking there: drop what the old fetch buffered
            return "dup", None
        self.seeking[tp] = (want, now)
        self.seeks += 1
        log.warning("%s: %s offset %d arrived, %d expected: seeking back", self.name, tp,
                    offset, want)
        return "seek", want


async def first_due(app: Any, guard: OffsetGuard, tp: Any) -> int:
    """The first offset due on ``tp`` since its assignment.

    In order: the committed offset Faust knows; else the one the broker holds for
    the group (Faust can resume fetching before its own seek to the commit, and
    maps a commit of 0 to none); else the offset after the last we let through
    before a revocation; else the partition's beginning. The answer is kept until
    the partition is revoked."""
    known = guard.baseline(tp, app.consumer._committed_offset.get(tp))
    if known is not None:
        return known
    found: int | None = None
    try:
        from faust.transport.drivers.aiokafka import ensure_aiokafka_TP

        thread = app.consumer._thread
        atp = ensure_aiokafka_TP(tp)
        found = await thread.call_thread(thread._ensure_consumer().committed, atp)
        if found is None or found < 0:
            found = guard.stale.get(tp)
        if found is None:
            found = (await app.consumer.earliest_offsets(tp)).get(tp)
    except Exception as exc:  # noqa: BLE001 - mid-rebalance: the beginning is safe
        log.warning("%s: %s: committed offset unknown (%r): starting at the beginning",
                    guard.name, tp, exc)
        found = guard.stale.get(tp)
    found = found if found is not None and found >= 0 else 0
    guard.resolved[tp] = found
    return found


async def seek(app: Any, tp: Any, offset: int) -> None:
    """Seek ``tp`` to ``offset`` on the consumer's own thread.

    Faust's ``Consumer.seek`` calls aiokafka's ``seek`` from the caller's thread, and
    that deletes the partition's entry from the fetcher's buffered records while the
    consumer thread may be iterating them in ``fetched_records``: the worker crashed
    with ``KeyError(TopicPartition(...))`` in the fetcher (bench/stream_throughput.py,
    100k entities on Tansu).  Through ``call_thread`` the seek runs between the
    consumer thread's own steps."""
    consumer = app.consumer
    thread = getattr(consumer, "_thread", None)
    if thread is None or not hasattr(thread, "call_thread"):
        await consumer.seek(tp, offset)
        return
    await thread.call_thread(thread.seek, tp, offset)
    consumer._read_offset[tp] = offset if offset else None  # as Consumer.seek does


async def _let_through(app: Any, guard: OffsetGuard, event: Any) -> bool:
    """Whether ``guard`` lets ``event`` through; a jump seeks its partition back."""
    tp = event.message.tp
    committed = None if tp in guard.expected else await first_due(app, guard, tp)
    verdict, to = guard.admit(tp, event.message.offset, committed)
    if verdict == "seek":
        assert to is not None
        await seek(app, tp, to)
    return verdict == "ok"


async def contiguous(app: Any, stream: Any, guard: OffsetGuard) -> AsyncIterator[Any]:
    """``stream.events()`` with every partition's offsets in order, none skipped."""
    async for event in stream.events():
        if await _let_through(app, guard, event):
            yield event


async def admit_batch(app: Any, guard: OffsetGuard, events: list[Any]) -> list[Any]:
    """The events of a batch (``stream.take_events``) that :class:`OffsetGuard` lets
    through, in order; a jump seeks its partition back (the batch is acked whole by
    Faust, and what was not let through comes again after the seek)."""
    return [event for event in events if await _let_through(app, guard, event)]


async def unstick_tails(app: Any, guards: Any, quiet_s: float = 3.0) -> int:
    """Seek partitions whose tail was dropped; returns how many.

    A jump is seen when the next message arrives; a dropped *tail* has no next
    message.  Stalled: the client's highwater is past the guard's next expected
    offset, nothing was let through for ``quiet_s`` and the partition is neither
    paused nor recovering."""
    consumer = app.consumer
    if app.tables.recovery.in_recovery or not consumer.flow_active:
        return 0
    now = time.monotonic()
    n = 0
    for g in guards:
        for tp in consumer.assignment():
            if tp.topic not in g.topics or tp in consumer._paused_partitions:
                continue
            want = g.expected.get(tp)
            if want is None:
                # Nothing let through since the assignment (the core drops replays).
                want = await first_due(app, g, tp)
            high = consumer.highwater(tp)
            if high is None or high <= want:
                continue
            last = g.admitted_at.get(tp)
            if last is None:
                g.admitted_at[tp] = now  # start the clock
                continue
            pending = g.seeking.get(tp)
            if now - last < quiet_s or (pending and now - pending[1] < quiet_s):
                continue
            log.warning("%s: %s stalled at offset %d with the highwater at %d: seeking back",
                        g.name, tp, want, high)
            g.expected[tp] = want
            g.seeking[tp] = (want, now)
            g.seeks += 1
            await seek(app, tp, want)
            n += 1
    return n
