"""The in-process hand-off of ready batches (streams/ready.Handoff): a worker running the
readiness and the conditions role gives its agent the Items a batch was encoded from
instead of decoding the batch it just wrote.

It rests on one property: decoding a batch the readiness stage wrote gives back exactly
the Items it wrote it from.  The rest is the bound: the readiness stage waits while the
agent is behind, and nothing kept can hold it up for longer than ``max_age_s``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from tests.unit.cdc import samples
from tests.unit.test_readiness_commit_time import _consumer, _Msg, _NoDeadLetters
from wakeline.core.events import RecordChanged
from wakeline.core.plan import Rec
from wakeline.streams import ready


def _items(n: int, first: int = 0) -> list[ready.Item]:
    return [ready.Item(f'{{"workspace":"w","entity":"e{i}"}}'.encode(), "w", f"e{i}", i,
                       [RecordChanged("c", Rec(i + 1, "main", content={"i": i},
                                               enriched_at=1.7e9 + i, created_at=1.7e9),
                                      None, (7 << 64) | i)])
            for i in range(first, first + n)]


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_batches_the_readiness_stage_writes_decode_to_its_items(tmp_path: Path) -> None:
    """Every captured change envelope (relay and Debezium forms, inserts, updates,
    deletes, cursor advances), as the readiness stage turns it into an Item."""
    rc = _consumer(tmp_path)
    by_partition: dict[int, list[ready.Item]] = {}
    for m in samples.messages():
        v = json.loads(m["value"]) if m["value"] else None
        item = rc.handle(_Msg(m, broker_ms=(v or {}).get("source", {}).get("ts_ms", 0)),
                         _NoDeadLetters())
        if item is not None:
            by_partition.setdefault(m["partition"], []).append(item)
    assert sum(map(len, by_partition.values())) >= 5
    for p, items in by_partition.items():
        for t in (None, 1_780_000_000_123):
            assert ready.decode(ready.encode(p, items, t)) == \
                (p, items, None if t is None else t / 1000.0)


def test_a_kept_batch_comes_back_as_its_items_once() -> None:
    h = ready.Handoff()
    h.own({2})
    items = _items(3)
    value = ready.encode(2, items, 1_780_000_000_500)
    h.put(value, 2, items, 1_780_000_000_500)
    # the agent reads the message as another bytes object with the same contents
    p, got, sent = ready.decode(bytes(bytearray(value)), h)
    assert (p, sent) == (2, 1_780_000_000.5) and got is items
    assert (h.kept, h.taken, len(h)) == (1, 1, 0)
    # read again (a replay): decoded, equal
    p2, again, _ = ready.decode(value, h)
    assert again == items and again is not items and h.taken == 1
    # a batch that was never kept is decoded
    other = ready.encode(2, _items(2, first=10))
    assert ready.decode(other, h)[1] == _items(2, first=10)


def test_only_the_agents_partitions_are_kept_and_a_lost_one_is_dropped() -> None:
    h = ready.Handoff()
    h.own({0, 1})
    assert h.wants(0) and not h.wants(3)
    for p in (0, 1):
        h.put(ready.encode(p, _items(2)), p, _items(2), None)
    h.own({1})  # partition 0 revoked
    assert (len(h), h.dropped) == (1, 1)
    assert h.take(ready.encode(0, _items(2))) is None


def test_a_batch_that_does_not_fit_is_not_kept_and_is_decoded() -> None:
    h = ready.Handoff(max_changes=4, max_age_s=5.0, clock=_Clock())
    h.own({0})
    first, second = ready.encode(0, _items(4)), ready.encode(0, _items(2, first=4))
    assert h.put(first, 0, _items(4), None)
    assert not h.put(second, 0, _items(2, first=4), None)  # no room: never waits
    assert (h.kept, h.full) == (1, 1)
    assert ready.decode(second, h)[1] == _items(2, first=4)  # decoded instead
    assert h.take(first) is not None
    assert h.put(second, 0, _items(2, first=4), None)  # room again


def test_a_batch_never_taken_is_dropped_after_max_age_when_room_is_needed() -> None:
    clock = _Clock()
    h = ready.Handoff(max_changes=4, max_age_s=5.0, clock=clock)
    h.own({0})
    h.put(b"old", 0, _items(4), None)
    clock.t += 4.9
    assert not h.put(b"new", 0, _items(1), None)  # the old one is young enough
    clock.t += 0.2
    assert h.put(b"new", 0, _items(1), None)
    assert (len(h), h.dropped) == (1, 1) and h.take(b"old") is None


def test_a_batch_larger_than_the_bound_is_kept_when_nothing_else_is() -> None:
    h = ready.Handoff(max_changes=2, clock=_Clock())
    assert h.put(b"big", 0, _items(10), None)
    assert len(h) == 1


def _gated(tmp_path: Path, start_after: threading.Event, start_after_s: float = 30.0):
    rc = _consumer(tmp_path)
    rc.start_after, rc.start_after_s = start_after, start_after_s
    began = threading.Event()
    rc._session = began.set  # type: ignore[method-assign]  # reads nothing: records the start
    return rc, began


def test_a_workers_readiness_stage_reads_once_its_own_agent_is_assigned(tmp_path: Path) -> None:
    assigned = threading.Event()
    rc, began = _gated(tmp_path, assigned)
    rc.start()
    assert not began.wait(0.4)  # the agent has no assignment yet: nothing read
    assigned.set()
    assert began.wait(5)
    rc.join(5)


def test_an_agent_that_never_gets_assigned_holds_readiness_up_for_a_bounded_time(
        tmp_path: Path) -> None:
    rc, began = _gated(tmp_path, threading.Event(), start_after_s=0.3)
    t0 = time.monotonic()
    rc.start()
    assert began.wait(5)
    assert time.monotonic() - t0 >= 0.3
    rc.join(5)
