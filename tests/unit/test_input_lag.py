"""The conditions agent's event-time view of a partition (streams/app.input_lag): a
partition still being read is evaluated at now - lag, an idle one at now."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from wakeline.streams.app import IDLE_S, LAG_MAX, input_lag


class _TP:
    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition


class _Consumer:
    def __init__(self, highwater: dict[int, int]) -> None:
        self.high = highwater

    def assignment(self) -> list[Any]:
        if not hasattr(self, "tps"):
            self.tps = [_TP("r", p) for p in self.high] + [_TP("stimuli", 0)]
        return self.tps

    def highwater(self, tp: Any) -> int:
        return self.high[tp.partition]


def lag(highwater: dict[int, int], expected: dict[int, int], seen: dict[int, float],
        read_ago: dict[int, float]) -> dict[int, float]:
    consumer = _Consumer(highwater)
    tps = {tp.partition: tp for tp in consumer.assignment() if tp.topic == "r"}
    real = time.time()
    rt = SimpleNamespace(seen_until={p: real - s for p, s in seen.items()},
                         read_at={p: real - s for p, s in read_ago.items()})
    guard = SimpleNamespace(expected={tps[p]: o for p, o in expected.items()})
    out = input_lag(SimpleNamespace(consumer=consumer), rt, guard, "r", real)  # type: ignore[arg-type]
    return {p: round(v) for p, v in out.items()}


def test_a_partition_with_unread_messages_is_behind_by_its_latest_arrival() -> None:
    # partition 0: 40 messages unread, its latest record arrived 12 s ago
    assert lag({0: 100}, {0: 60}, {0: 12.0}, {0: 5.0}) == {0: 12}


def test_a_partition_read_to_its_end_and_quiet_is_evaluated_at_now() -> None:
    assert lag({0: 100}, {0: 100}, {0: 12.0}, {0: IDLE_S + 1}) == {}


def test_a_partition_read_moments_ago_counts_as_still_being_read() -> None:
    # (Tansu's highwater can fall short of the real end: it alone misses a backlog)
    assert lag({0: 100}, {0: 100}, {0: 3.0}, {0: 0.0}) == {0: 3}


def test_the_lag_is_capped_and_partitions_never_applied_have_none() -> None:
    assert lag({0: 100, 1: 9}, {0: 1, 1: 1}, {0: 600.0}, {0: 0.0}) == {0: round(LAG_MAX)}
