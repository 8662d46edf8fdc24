"""Ready batches: the readiness stage's hand-off to the conditions agents (streams/ready.py)."""

from __future__ import annotations

import pytest

from wakeline.core.events import CursorAdvanced, RecordChanged
from wakeline.core.plan import Rec
from wakeline.streams import ready


def _rec(seq: int, **kw) -> Rec:
    base = dict(seq=seq, collection="main", version=2, type="chat", status="active", key=None,
                content={"n": 1.5, "deep": {"l": [1, None, True]}, "big": 2 ** 70}, text="t\x01",
                tombstone=False, annotations={"mood": {"v": 0.1}}, scores={"importance": 7},
                enriched_at=1_780_000_000.25, created_at=1_780_000_000.0, parents=(3, 4))
    base.update(kw)
    return Rec(**base)


def test_a_batch_round_trips_exactly() -> None:
    pos = (0x16B374D8 << 64) | 0x16B37500  # prev commit lsn << 64 | lsn: beyond 64 bits
    items = [
        ready.Item(b'{"workspace":"w","entity":"user:a"}', "w", "user:a", 10,
                   [RecordChanged("c", _rec(1), None, pos)]),
        ready.Item(b'{"workspace":"w","entity":"user:b"}', "w", "user:b", 11,
                   [RecordChanged("u", _rec(2, key="role", enriched_at=None),
                                  _rec(2, key="role", enriched_at=None, status="archived"), pos + 1)]),
        ready.Item(b'{"workspace":"w","entity":"user:a"}', "w", "user:a", 12,
                   [RecordChanged("d", None, _rec(1, tombstone=True), 0)]),
        ready.Item(b'{"workspace":"w","entity":"user:a"}', "w", "user:a", 13,
                   [CursorAdvanced("profile", 2, 1_780_000_001.5, "succeeded", "w/profile/a/1",
                                   pos + 2)]),
    ]
    p, back, sent = ready.decode(ready.encode(3, items))
    assert p == 3 and sent is None
    assert back == items
    assert ready.decode(ready.encode(3, items, 1_780_000_000_123))[2] == 1_780_000_000.123
    assert isinstance(back[0].events[0].after.parents, tuple)


def test_something_else_on_the_ready_topic_is_a_typed_error() -> None:
    for bad in (b"not json", b"[]", b'{"v": 99, "p": 0, "items": []}',
                b'{"v": 1, "p": 0, "items": [["k", "w", "e", 1, ["x"]]]}',
                b'{"v": 1, "p": 0, "t": "noon", "items": []}'):
        with pytest.raises(ready.BadBatch) as err:
            ready.decode(bad)
        assert err.value.code == "stream.bad_ready_batch"


def test_chunks_keep_order_and_bound_items_and_bytes() -> None:
    items = list(range(10))
    assert [list(c) for c in ready.chunks(items, [1] * 10, max_items=4)] == \
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    sizes = [100, 100, 900, 100, 2000, 10]
    assert [list(c) for c in ready.chunks(list(range(6)), sizes, max_bytes=1000)] == \
        [[0, 1], [2, 3], [4], [5]]  # a single item over the budget goes alone
    assert list(ready.chunks([], [])) == []
