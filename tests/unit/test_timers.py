"""The time index: due keys once, earliest first; moved, removed, resent and dropped keys."""

from __future__ import annotations

import random

import pytest

from wakeline.streams import timers
from wakeline.streams.timers import COMPACT_SLACK, TimerIndex


def k(i: int) -> bytes:
    return f"e{i}".encode()


def test_pop_due_returns_each_due_key_once():
    idx = TimerIndex()
    idx.set(0, k(1), 30.0)
    idx.set(1, k(2), 10.0)
    idx.set(2, k(3), 20.0)
    idx.set(0, k(4), 99.0)
    assert idx.pop_due(5.0) == []
    assert idx.pop_due(30.0) == [k(2), k(3), k(1)], "partitions by their earliest key"
    assert idx.pop_due(40.0) == [], "in flight until re-registered"
    assert len(idx) == 4 and idx.next_due() == 99.0


def test_past_the_limit_the_partition_with_the_oldest_key_goes_first_next_tick():
    idx = TimerIndex()
    for i in range(6):
        idx.set(0, k(i), 1.0 + i)        # partition 0: 1..6
        idx.set(1, k(10 + i), 1.5 + i)   # partition 1: 1.5..6.5
    assert idx.pop_due(100.0, limit=4) == [k(0), k(1), k(2), k(3)]
    assert idx.pop_due(100.2, limit=4) == [k(10), k(11), k(12), k(13)], "no starving"
    assert idx.pop_due(100.4, limit=100) == [k(4), k(5), k(14), k(15)]


def test_a_moved_deadline_fires_only_at_its_new_time():
    idx = TimerIndex()
    idx.set(0, k(1), 10.0)
    idx.set(0, k(1), 50.0)      # later (debounce)
    assert idx.pop_due(20.0) == []
    idx.set(0, k(1), 15.0)      # earlier again
    assert idx.pop_due(20.0) == [k(1)]
    idx.set(0, k(1), 200.0)     # the tick's processing re-registers the next deadline
    assert idx.pop_due(60.0) == [], "the superseded 50.0 entry does not fire"
    assert idx.pop_due(200.0) == [k(1)]


def test_removed_key_never_fires_and_leaves_nothing_behind():
    idx = TimerIndex()
    idx.set(0, k(1), 10.0)
    idx.set(0, k(1), None)
    idx.set(0, k(2), None)      # removing an absent key is a no-op
    assert len(idx) == 0 and idx.pop_due(20.0) == [] and idx.next_due() is None


def test_a_ticked_key_re_registered_with_the_same_deadline_fires_again():
    """The tick did not move the entity's deadline (the job is still waiting): the
    re-registration must put it back in the heap, not be taken for a no-op."""
    idx = TimerIndex()
    idx.set(0, k(1), 10.0)
    assert idx.pop_due(10.0) == [k(1)]
    idx.set(0, k(1), 10.0)
    assert idx.pop_due(10.2) == [k(1)]


def test_a_tick_never_re_registered_is_sent_again_after_resend_after():
    idx = TimerIndex()
    idx.resend_after = 30.0
    idx.set(0, k(1), 10.0)
    idx.set(0, k(2), 10.0)
    assert idx.pop_due(10.0) == [k(1), k(2)]
    idx.set(0, k(2), 500.0)     # k(2)'s tick was processed; k(1)'s was lost
    assert idx.pop_due(39.9) == []
    assert idx.pop_due(40.0) == [k(1)]
    assert idx.pop_due(69.0) == []
    assert idx.pop_due(70.0, limit=0) == [], "resends count against the limit"
    assert idx.pop_due(70.0) == [k(1)]
    idx.set(0, k(1), None)
    assert idx.pop_due(1000.0) == [k(2)]


def test_drop_partitions_forgets_their_keys_including_those_in_flight():
    idx = TimerIndex()
    idx.set(0, k(1), 10.0)
    idx.set(1, k(2), 10.0)
    idx.set(1, k(3), 50.0)
    idx.set(2, k(4), 10.0)
    assert idx.pop_due(10.0) == [k(1), k(2), k(4)]
    idx.drop_partitions({1})
    assert len(idx) == 2
    assert idx.pop_due(20.0) == [] and idx.pop_due(100.0) == [k(1), k(4)], "resent, not k(2)"


def test_a_key_moving_partition_fires_from_its_new_one_only():
    idx = TimerIndex()
    idx.set(0, k(1), 10.0)
    idx.set(3, k(1), 10.0)
    assert idx.pop_due(10.0) == [k(1)]
    idx.drop_partitions({0})
    assert len(idx) == 1


def test_moving_deadlines_many_times_keeps_the_heaps_the_size_of_the_pending_set():
    idx = TimerIndex()
    n = 3 * COMPACT_SLACK
    for move in range(20):
        for i in range(n):
            idx.set(i % 2, k(i), 100.0 + move + i * 1e-6)
    held = sum(len(h) for h in idx._heaps.values())
    assert len(idx) == n and held <= 2 * n + 2 * COMPACT_SLACK + 2
    due = idx.pop_due(1000.0, limit=10 * n)
    assert sorted(due) == sorted(k(i) for i in range(n)) and len(due) == n


@pytest.mark.parametrize("slack", [COMPACT_SLACK, 2])
def test_against_a_model_over_random_operations(monkeypatch, slack):
    """Every pop_due equals a plain model: resends first (in send order), then the keys
    due and not in flight, partition by partition in the order of their earliest
    such key, each by (due, key), up to the limit (with the heaps compacted as
    rarely as in production, and very often)."""
    monkeypatch.setattr(timers, "COMPACT_SLACK", slack)
    for seed in range(40):
        rnd = random.Random(seed)
        idx = TimerIndex()
        idx.resend_after = 5.0
        due: dict[bytes, tuple[float, int]] = {}
        sent: dict[bytes, tuple[float, int]] = {}  # key -> (sent at, send order)
        order = 0
        now = 0.0
        for _ in range(400):
            op = rnd.random()
            key = k(rnd.randrange(30))
            if op < 0.5:
                p = rnd.randrange(4) if key not in due or rnd.random() < 0.05 else due[key][1]
                when = now + rnd.choice([0.0, rnd.random() * 3, rnd.random() * 20])
                if key in due and rnd.random() < 0.2:
                    when = due[key][0]  # the same deadline again
                idx.set(p, key, when)
                due[key] = (when, p)
                sent.pop(key, None)
            elif op < 0.6:
                idx.set(0, key, None)
                due.pop(key, None)
                sent.pop(key, None)
            elif op < 0.65:
                gone = {rnd.randrange(4)}
                idx.drop_partitions(gone)
                for key2 in [x for x, (_, p) in due.items() if p in gone]:
                    del due[key2]
                    sent.pop(key2, None)
            else:
                now += rnd.random() * 2
                limit = rnd.choice([1, 3, 100])
                resend = sorted((n, x) for x, (t, n) in sent.items() if now - t >= 5.0)
                expect = [x for _, x in resend][:limit]
                ready: dict[int, list[tuple[float, bytes]]] = {}
                for x, (d, p) in due.items():
                    if d <= now and x not in sent:
                        ready.setdefault(p, []).append((d, x))
                for p in sorted(ready, key=lambda p: (min(ready[p])[0], p)):
                    expect += [x for _, x in sorted(ready[p])]
                expect = expect[:limit]
                got = idx.pop_due(now, limit=limit)
                assert got == expect, (seed, now, got, expect)
                for x in got:
                    order += 1
                    sent[x] = (now, order)
            assert len(idx) == len(due)
            for p, heap in idx._heaps.items():
                live = sum(1 for e in heap if idx._entry.get(e[1]) is e
                           and e[1] not in idx._inflight)
                assert idx._stale[p] == len(heap) - live, "superseded entries are counted"


def test_a_bound_holds_back_a_partitions_keys_due_after_it():
    t = TimerIndex()
    t.set(0, b"a", 10.0)
    t.set(0, b"b", 20.0)
    t.set(1, b"c", 20.0)
    # partition 0 has read its input up to 15: b waits; partition 1 is unbounded
    assert sorted(t.pop_due(30.0, bounds={0: 15.0})) == [b"a", b"c"]
    assert t.pop_due(30.0, bounds={0: 19.9}) == []
    assert t.pop_due(30.0, bounds={0: 20.0}) == [b"b"]  # still registered, due now
