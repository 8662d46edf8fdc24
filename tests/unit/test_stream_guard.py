"""The offset guard: each partition's events in order, none skipped (streams/guard.py)."""

from __future__ import annotations

from wakeline.streams import guard as g
from wakeline.streams.guard import OffsetGuard


def test_first_event_must_be_the_committed_offset() -> None:
    og = OffsetGuard("t")
    assert og.admit("p0", 10, committed=7) == ("seek", 7)
    assert og.admit("p0", 11, committed=7) == ("dup", None)  # the old fetch's buffer
    assert og.admit("p0", 7, committed=7) == ("ok", None)
    assert og.admit("p0", 8, committed=7) == ("ok", None)
    assert og.seeks == 1


def test_without_a_commit_the_first_event_is_the_baseline() -> None:
    og = OffsetGuard("t")
    assert og.admit("p0", 3, committed=None) == ("ok", None)
    assert og.admit("p0", 4, committed=None) == ("ok", None)
    assert og.admit("p1", 0, committed=-1001) == ("ok", None)


def test_a_jump_seeks_back_and_duplicates_are_skipped() -> None:
    og = OffsetGuard("t")
    for off in range(5):
        assert og.admit("p0", off, committed=0) == ("ok", None)
    assert og.admit("p0", 9, committed=0) == ("seek", 5)
    assert og.admit("p0", 10, committed=0) == ("dup", None)
    assert og.admit("p0", 3, committed=0) == ("dup", None)
    assert [og.admit("p0", off, committed=0)[0] for off in range(5, 11)] == ["ok"] * 6
    assert (og.duplicates, og.ahead, og.seeks) == (1, 1, 1)


def test_a_seek_is_repeated_when_the_missing_offset_never_comes(monkeypatch) -> None:
    og = OffsetGuard("t")
    og.admit("p0", 0, committed=0)
    now = [100.0]
    monkeypatch.setattr(g.time, "monotonic", lambda: now[0])
    assert og.admit("p0", 5, committed=0) == ("seek", 1)
    now[0] += g.RESEEK_AFTER / 2
    assert og.admit("p0", 6, committed=0) == ("dup", None)
    now[0] += g.RESEEK_AFTER
    assert og.admit("p0", 7, committed=0) == ("seek", 1)
    assert og.seeks == 2


def test_forgotten_partitions_start_again_at_the_commit() -> None:
    og = OffsetGuard("t")
    og.admit("p0", 0, committed=0)
    og.admit("p0", 1, committed=0)
    og.forget(["p0"])
    assert og.admit("p0", 0, committed=0) == ("ok", None)  # our own replay, not a dup


def test_a_partition_owned_again_resumes_after_our_last_offset_when_no_commit_is_known() -> None:
    og = OffsetGuard("t")
    for off in range(100):
        og.admit("p3", off, committed=0)
    og.forget(["p3"])
    # offset 100 was fetched and dropped in the rebalance; the commit is not known yet
    assert og.admit("p3", 101, committed=None) == ("seek", 100)
    assert og.admit("p3", 100, committed=None) == ("ok", None)
    og.forget(["p3"])
    assert og.admit("p3", 250, committed=250) == ("ok", None)  # the commit wins
