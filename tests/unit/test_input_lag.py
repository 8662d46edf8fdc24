"""The conditions agent's event-time view of a partition (streams/app.input_lag): a
partition still being read is evaluated at now - lag, an idle one at now."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from wakeline.streams.batch import IDLE_S, LAG_MAX, LAG_MIN, event_times


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


NOW = 1_800_000_000.0  # the injected clock: independent of the real one


def times(highwater: dict[int, int], expected: dict[int, int], behind: dict[int, float],
          read_ago: dict[int, float], seen: dict[int, float] | None = None
          ) -> dict[int, float]:
    """event_times, as seconds before NOW per partition; ``seen``: per partition, how
    long before NOW its latest arrival was (default: long ago)."""
    consumer = _Consumer(highwater)
    tps = {tp.partition: tp for tp in consumer.assignment() if tp.topic == "r"}
    real = time.time()
    rt = SimpleNamespace(behind=dict(behind),
                         read_at={p: real - s for p, s in read_ago.items()},
                         seen_until={p: NOW - s for p, s in (seen or {}).items()})
    guard = SimpleNamespace(expected={tps[p]: o for p, o in expected.items()})
    out = event_times(SimpleNamespace(consumer=consumer), rt, guard, "r", NOW)  # type: ignore[arg-type]
    return {p: round(NOW - v, 3) for p, v in out.items()}


def test_a_partition_with_unread_messages_is_evaluated_as_far_back_as_it_is_behind() -> None:
    # partition 0: 40 messages unread, its last batch had waited 12 s in the topic
    assert times({0: 100}, {0: 60}, {0: 12.0}, {0: 5.0}) == {0: 12.0}


def test_a_partition_read_to_its_end_and_quiet_is_evaluated_at_now() -> None:
    assert times({0: 100}, {0: 100}, {0: 12.0}, {0: IDLE_S + 1}) == {}


def test_a_partition_read_moments_ago_counts_as_still_being_read() -> None:
    # (Tansu's highwater can fall short of the real end: it alone misses a backlog)
    assert times({0: 100}, {0: 100}, {0: 3.0}, {0: 0.0}) == {0: 3.0}


def test_the_lag_is_capped_and_partitions_never_applied_have_none() -> None:
    assert times({0: 100, 1: 9}, {0: 1, 1: 1}, {0: 600.0}, {0: 0.0}) == {0: LAG_MAX}


def test_never_before_the_latest_arrival_read() -> None:
    # behind by 12 s, but a record that arrived 2 s before now was already read
    assert times({0: 100}, {0: 60}, {0: 12.0}, {0: 0.0}, seen={0: 2.0}) == {0: 2.0}
    # a record stamped at now itself (a frozen test clock) was read: evaluate at now
    assert times({0: 100}, {0: 60}, {0: 0.4}, {0: 0.0}, seen={0: 0.0}) == {}


def test_keeping_up_is_evaluated_at_now_whatever_the_injected_clock_did() -> None:
    # read 5 ms after it was written, and the test clock jumped 30 min since that
    # record's arrival: the lag is real time in the topic, under LAG_MIN
    assert times({0: 100}, {0: 100}, {0: 0.005}, {0: 0.0}, seen={0: 1800.0}) == {}
    # just over LAG_MIN (and the highwater shows a backlog): shifted by exactly that
    assert times({0: 100}, {0: 60}, {0: LAG_MIN + 0.05}, {0: 0.0},
                 seen={0: 1800.0}) == {0: round(LAG_MIN + 0.05, 3)}
