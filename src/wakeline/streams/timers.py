"""The time index: which entities need a tick, found at O(due) cost.

One heap per assigned partition of ``(due, key)`` with lazy deletion (the latest
due per key wins).  Rebuilt from the state table when partitions are assigned;
dropped when they are revoked.  ``pop_due(now)`` returns each due key once and
marks it in flight until the agent processes its tick and re-registers the
entity's next wakeup.
"""

from __future__ import annotations

import heapq


class TimerIndex:
    def __init__(self) -> None:
        self._heaps: dict[int, list[tuple[float, bytes]]] = {}
        self._due: dict[bytes, float] = {}
        self._partition: dict[bytes, int] = {}
        self._inflight: dict[bytes, float] = {}
        self.resend_after = 30.0

    def __len__(self) -> int:
        return len(self._due)

    def set(self, partition: int, key: bytes, due: float | None) -> None:
        self._inflight.pop(key, None)
        if due is None:
            self._due.pop(key, None)
            return
        if self._due.get(key) == due:
            return
        self._due[key] = due
        self._partition[key] = partition
        heapq.heappush(self._heaps.setdefault(partition, []), (due, key))

    def drop_partitions(self, partitions: set[int]) -> None:
        for p in partitions:
            for _, key in self._heaps.pop(p, []):
                if self._partition.get(key) == p:
                    self._due.pop(key, None)
                    self._partition.pop(key, None)
                    self._inflight.pop(key, None)

    def pop_due(self, now: float, limit: int = 10_000) -> list[bytes]:
        out: list[bytes] = []
        # A tick whose processing never re-registered the key is sent again.
        for key, sent in list(self._inflight.items()):
            if now - sent >= self.resend_after and key in self._due:
                self._inflight[key] = now
                out.append(key)
        for heap in self._heaps.values():
            while heap and heap[0][0] <= now and len(out) < limit:
                due, key = heapq.heappop(heap)
                if self._due.get(key) != due or key in self._inflight:
                    continue  # superseded entry
                self._inflight[key] = now
                out.append(key)
        return out

    def next_due(self) -> float | None:
        best = None
        for heap in self._heaps.values():
            while heap and self._due.get(heap[0][1]) != heap[0][0]:
                heapq.heappop(heap)
            if heap and (best is None or heap[0][0] < best):
                best = heap[0][0]
        return best
