"""The time index: which entities need a tick, found at O(due) cost.

One heap per assigned partition of ``(due, key, partition)`` with lazy deletion
(the latest registration of a key wins).  Rebuilt from the entity store when
partitions are assigned; dropped when they are revoked.  ``pop_due(now)``
returns each due key once and marks it in flight until the agent processes its
tick and re-registers the entity's next wakeup.

Costs, with N pending keys and D due: ``set`` is O(log N); ``pop_due`` is
O((D + S) log N + P log P) where S counts the superseded entries that come due and P
the assigned partitions — never O(N), nor O(keys in flight): a tick whose
processing never re-registered its key is found again through a FIFO of the
batches sent (O(1) amortised per tick sent).  Superseded entries (a debounce
moved by every record) are compacted away once they outnumber the live ones in
a partition, so the heaps hold O(pending) entries however often deadlines move
(amortised O(1) per ``set``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection

#: A partition's heap is rebuilt when its superseded entries exceed its live ones
#: plus this many (small heaps are not worth compacting).
COMPACT_SLACK = 1024


#: A heap entry: (due, key, partition).  The key's current registration is the very
#: tuple ``TimerIndex._entry[key]`` (compared by identity); any other entry of the
#: key is superseded.
Entry = tuple[float, bytes, int]


class TimerIndex:
    def __init__(self) -> None:
        self._heaps: dict[int, list[Entry]] = {}
        self._stale: dict[int, int] = {}  # superseded entries per partition heap
        self._entry: dict[bytes, Entry] = {}  # key -> its current registration
        self._inflight: dict[bytes, float] = {}  # key -> when its tick was sent
        self._sent: deque[tuple[float, tuple[bytes, ...]]] = deque()  # ticks sent
        self.resend_after = 30.0

    def __len__(self) -> int:
        return len(self._entry)

    def set(self, partition: int, key: bytes, due: float | None) -> None:
        was_inflight = self._inflight.pop(key, None) is not None
        cur = self._entry.get(key)
        if cur is not None and not was_inflight:
            if cur[0] == due and cur[2] == partition:
                return
            # The key's live heap entry is superseded by this call.
            self._stale[cur[2]] += 1
        if due is None:
            if cur is not None:
                del self._entry[key]
            return
        entry = self._entry[key] = (due, key, partition)
        heap = self._heaps.get(partition)
        if heap is None:
            heap = self._heaps[partition] = []
            self._stale[partition] = 0
        heapq.heappush(heap, entry)
        self._maybe_compact(partition)

    def drop_partitions(self, partitions: Collection[int]) -> None:
        for p in partitions:
            self._stale.pop(p, None)
            for entry in self._heaps.pop(p, []):
                if self._entry.get(entry[1]) is entry:
                    self._forget(entry[1])
        # Keys in flight have no heap entry: find the dropped ones among them.
        for key in [k for k in self._inflight if self._entry[k][2] in partitions]:
            self._forget(key)

    def pop_due(self, now: float, limit: int = 10_000,
                bounds: dict[int, float] | None = None) -> list[bytes]:
        """The keys due at ``now``, at most ``limit``; each is in flight until ``set``
        re-registers it (or sent again after ``resend_after``).  ``bounds`` holds back
        a partition's keys due after its bound (see ``wakeline.streams.app.tick_bounds``):
        they stay registered and come due at a later call.

        Partitions are drained in the order of their earliest due key, each earliest
        first: all due keys when they fit the limit; past it, the partition holding
        the oldest overdue key goes first next tick, so none starves.  (An exact
        merge across partitions costs a heads-heap operation per key: ~30% more.)
        """
        out: list[bytes] = []
        self._resend(now, limit, out)
        current, inflight = self._entry, self._inflight
        heappop = heapq.heappop
        heads = []
        for p, heap in self._heaps.items():
            stale = 0
            while heap and current.get(heap[0][1]) is not heap[0]:
                heappop(heap)  # superseded entries at the top go first
                stale += 1
            self._stale[p] -= stale
            cut = now if bounds is None else min(now, bounds.get(p, now))
            if heap and heap[0][0] <= cut:
                heads.append((heap[0][0], p))
        heads.sort()
        n = len(out)
        for _, p in heads:
            heap = self._heaps[p]
            cut = now if bounds is None else min(now, bounds.get(p, now))
            stale = 0
            while heap and n < limit:
                entry = heap[0]
                if entry[0] > cut:
                    break
                heappop(heap)
                key = entry[1]
                if current.get(key) is entry:  # (so not in flight: see _live)
                    inflight[key] = now
                    out.append(key)
                    n += 1
                else:
                    stale += 1  # a superseded entry
            self._stale[p] -= stale
        if out:
            self._sent.append((now, tuple(out)))
        return out

    def next_due(self) -> float | None:
        best = None
        for p, heap in self._heaps.items():
            while heap and not self._live(heap[0]):
                heapq.heappop(heap)
                self._stale[p] -= 1
            if heap and (best is None or heap[0][0] < best):
                best = heap[0][0]
        return best

    # -- internals ----------------------------------------------------------------------

    def _live(self, entry: Entry) -> bool:
        """Is this heap entry its key's current registration (not superseded)?

        Then the key is not in flight either: ``pop_due`` takes a key's current
        entry out of its heap when it sends the tick, and ``set`` makes a new one."""
        return self._entry.get(entry[1]) is entry

    def _forget(self, key: bytes) -> None:
        self._entry.pop(key, None)
        self._inflight.pop(key, None)

    def _resend(self, now: float, limit: int, out: list[bytes]) -> None:
        """A tick whose processing never re-registered the key is sent again.

        ``_sent`` holds one (sent at, keys) batch per ``pop_due``, oldest first; only
        the batches older than ``resend_after`` are looked at, each once."""
        sent, inflight = self._sent, self._inflight
        while sent and now - sent[0][0] >= self.resend_after:
            at, batch = sent[0]
            for i, key in enumerate(batch):
                if len(out) >= limit:
                    sent[0] = (at, batch[i:])
                    return
                if inflight.get(key) == at:  # else re-registered (or sent again) since
                    inflight[key] = now
                    out.append(key)
            sent.popleft()

    def _maybe_compact(self, p: int) -> None:
        heap = self._heaps[p]
        stale = self._stale[p]
        if stale <= len(heap) - stale + COMPACT_SLACK:
            return
        live = [entry for entry in heap if self._live(entry)]
        heapq.heapify(live)
        self._heaps[p] = live
        self._stale[p] = 0
