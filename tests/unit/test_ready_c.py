"""The C item decoder of ready batches (wakeline/core/_ccodec.c, ``ready_items``) against
its specification, ``ready.decode_items``: the same Items, types included, or None (and
ready.py, which raises the BadBatch a malformed message deserves)."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.core.test_codec import typed, values
from tests.unit.leaks import bytes_kept
from tests.unit.test_stream_ready import _rec
from wakeline.cdc._json import loads
from wakeline.core.events import CursorAdvanced, RecordChanged
from wakeline.streams import ready

C = ready._c_items
pytestmark = pytest.mark.skipif(C is None and not os.environ.get("CI"),
                                reason="the C side was not built (no C compiler at install)")


def test_the_c_decoder_is_built_and_used():
    assert C is not None, "wakeline.core._ccodec was not built by `pip install`"


def items_of(batch: bytes) -> Any:
    return loads(batch)["items"]  # as ready.decode reads it (ints beyond 64 bits too)


def both(raw: Any) -> tuple[Any, Any]:
    """(C's Items or None, ready.py's Items or the exception it raised), each decoding
    its own copy (ready.py's decoder rewrites the lists it reads)."""
    c = C(copy.deepcopy(raw))
    try:
        py: Any = ready.decode_items(copy.deepcopy(raw))
    except Exception as exc:  # noqa: BLE001 - the C side must defer on any of them
        py = exc
    return c, py


def agree(raw: Any, *, written: bool = False) -> None:
    """C gives ready.py's Items or None (always None where ready.py raises); for what
    ready.encode wrote (``written``), always the Items."""
    c, py = both(raw)
    if isinstance(py, Exception):
        assert c is None, f"C decoded what ready.py rejects ({py!r})"
    elif c is not None:
        assert typed(c) == typed(py)
    else:
        assert not written, "C left a batch ready.encode wrote to ready.py"


POS = (0x16B374D8 << 64) | 0x16B37500

ITEMS = [
    ready.Item(b'{"workspace":"w","entity":"user:a"}', "w", "user:a", 10,
               [RecordChanged("c", _rec(1), None, POS)]),
    ready.Item("ключ".encode(), "w", "user:b", 11,
               [RecordChanged("u", _rec(2, key="role", enriched_at=None),
                              _rec(2, key="role", enriched_at=None, status="archived"), 7),
                RecordChanged("r", _rec(3, parents=()), None, 0)]),
    ready.Item(b"k", "w", "user:a", 12, [RecordChanged("d", None, _rec(1, tombstone=True), 0)]),
    ready.Item(b"k", "w", "user:a", 13,
               [CursorAdvanced("profile", 2, 1_780_000_001.5, "succeeded", "w/profile/a/1",
                               POS + 2),
                CursorAdvanced("profile", 3, 1_780_000_002.5, "failed", None, 0)]),
    ready.Item(b"", "w", "user:c", 14, []),
]


def test_the_batches_ready_py_writes_decode_alike():
    raw = items_of(ready.encode(3, ITEMS))
    c, py = both(raw)
    assert typed(c) == typed(py)
    assert c == ITEMS
    assert all(type(e.after.parents) is tuple for e in c[1].events)
    _, back, _ = ready.decode(ready.encode(3, ITEMS))
    assert back == ITEMS


records = st.builds(
    lambda seq, kw: _rec(seq, **kw), st.integers(0, 2**62),
    st.fixed_dictionaries({}, optional={
        "key": st.one_of(st.none(), st.text(max_size=5)),
        "enriched_at": st.one_of(st.none(), st.floats(1.7e9, 1.8e9)),
        "content": st.dictionaries(st.text(max_size=4), values, max_size=3),
        "parents": st.lists(st.integers(0, 99), max_size=3).map(tuple),
        "tombstone": st.booleans()}))
events = st.one_of(
    st.builds(RecordChanged, st.sampled_from("curd"), st.one_of(st.none(), records),
              st.one_of(st.none(), records), st.integers(0, 2**128 - 1)),
    st.builds(CursorAdvanced, st.text(max_size=6), st.integers(0, 99), st.floats(0, 2e9),
              st.sampled_from(["succeeded", "failed", "dead"]),
              st.one_of(st.none(), st.text(max_size=8)), st.integers(0, 2**128 - 1)))
items = st.lists(st.builds(ready.Item, st.text(max_size=6).map(str.encode),
                           st.text(max_size=4), st.text(max_size=6), st.integers(0, 2**40),
                           st.lists(events, max_size=3)), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(items)
def test_arbitrary_batches_decode_alike(its):
    agree(items_of(ready.encode(0, its)), written=True)


def _damaged(raw: Any, draw: Any) -> Any:
    """``raw`` with one node somewhere replaced by an arbitrary JSON value."""
    raw = copy.deepcopy(raw)
    node, path = raw, []
    while isinstance(node, list) and node and draw(st.booleans()):
        i = draw(st.integers(0, len(node) - 1))
        path.append((node, i))
        node = node[i]
    junk = draw(st.one_of(st.none(), st.booleans(), st.integers(-3, 2**70), st.text(max_size=3),
                          st.lists(st.integers(0, 3), max_size=15), st.just("r"), st.just("a"),
                          st.just([]), st.dictionaries(st.text(max_size=2), st.integers())))
    if not path:
        return junk
    parent, i = path[-1]
    if draw(st.booleans()):
        parent[i] = junk
    elif draw(st.booleans()):
        del parent[i]
    else:
        parent.append(junk)
    return raw


@settings(max_examples=500, deadline=None)
@given(items, st.data())
def test_damaged_batches_are_left_to_ready_py(its, data):
    agree(_damaged(items_of(ready.encode(0, its)), data.draw))


def test_not_a_list_is_left_to_ready_py():
    assert C({"a": 1}) is None
    assert C(("k", "w", "e", 1)) is None
    assert C([["\ud800", "w", "e", 1]]) is None  # not UTF-8: ready.py's error
    with pytest.raises(UnicodeEncodeError):
        ready.decode_items([["\ud800", "w", "e", 1]])


def test_no_memory_is_kept_between_calls():
    raw = items_of(ready.encode(3, ITEMS))
    bad = [_cut for _cut in (raw[:1] + [raw[1][:3]], raw + [["k", "w", "e", 1, ["r", "c"]]],
                             raw + [["k", "w", "e", 1, ["a", 1, 2]]])]

    def once() -> None:
        C(copy.deepcopy(raw))
        for b in bad:
            assert C(copy.deepcopy(b)) is None

    grown = bytes_kept(once)
    assert grown < 8_000, f"{grown} bytes kept after 500 rounds"


@pytest.mark.parametrize("full", [
    ["k", "w", "e", 1],
    ["k", "w", "e", 1, ["r", "c", None, None, 0, 5]],
    ["k", "w", "e", 1, ["a", "d", 2, 3.5, "succeeded", None, 0, 5]],
])
def test_a_short_list_is_short_even_with_room_behind_it(full):
    """Lists cut by pop() keep their old items' slots allocated: the decoder must read
    lengths, not what lies past them."""
    assert C([copy.deepcopy(full)]) is not None
    cut = copy.deepcopy(full)
    (cut[-1] if len(cut) > 4 else cut).pop()
    assert C([cut]) is None
    with pytest.raises((IndexError, ready.BadBatch)):
        ready.decode_items([copy.deepcopy(cut)])


# -- the writer: ready_doc against ready.encode_items ---------------------------------------

D = ready._c_doc


def test_the_c_writer_builds_what_ready_py_builds():
    assert D is not None
    assert D(ITEMS) == ready.encode_items(ITEMS)
    assert D(tuple(ITEMS)) == ready.encode_items(ITEMS)  # any sequence, as chunks() slices
    assert D([]) == []


@settings(max_examples=300, deadline=None)
@given(items)
def test_arbitrary_batches_encode_alike(its):
    """The same lists, so the same bytes."""
    assert D(its) == ready.encode_items(its)


class OtherItem(ready.Item):
    __slots__ = ()


@pytest.mark.parametrize("odd", [
    [ready.Item("text key", "w", "e", 1, [])],                      # key not bytes
    [ready.Item(b"\xff", "w", "e", 1, [])],                          # key not UTF-8
    [ready.Item(b"k", "w", "e", 1, ("not", "a list"))],               # events not a list
    [ready.Item(b"k", "w", "e", 1, ["an event it does not know"])],
    [OtherItem(b"k", "w", "e", 1, [])],                              # a subclass
    [ready.Item(b"k", "w", "e", 1, [RecordChanged("c", "not a Rec", None, 0)])],
    [ready.Item(b"k", "w", "e", 1, [RecordChanged("c", None, None, "7")])],  # lsn not an int
])
def test_what_c_does_not_write_is_left_to_ready_py(odd, monkeypatch):
    assert D(odd) is None
    try:
        with_c: Any = ready.encode(0, odd)
    except Exception as exc:  # noqa: BLE001 - ready.py says what is wrong, as without C
        monkeypatch.setattr(ready, "_c_doc", None)
        with pytest.raises(type(exc)):
            ready.encode(0, odd)
        return
    monkeypatch.setattr(ready, "_c_doc", None)
    assert with_c == ready.encode(0, odd)


def test_negative_and_wide_positions_split_as_python_does():
    for lsn in (0, 1, 2**64 - 1, 2**64, 2**128 - 1, -1, -(2**70)):
        its = [ready.Item(b"k", "w", "e", 1, [RecordChanged("c", None, None, lsn),
                                              CursorAdvanced("d", 1, 2.0, "noop", None, lsn)])]
        assert D(its) == ready.encode_items(its)


def test_the_writer_keeps_no_memory():
    def once() -> None:
        assert D(ITEMS) is not None
        assert D([ready.Item(b"\xff", "w", "e", 1, [])]) is None
        assert D([ready.Item(b"k", "w", "e", 1, [RecordChanged("c", "x", None, 0)])]) is None

    grown = bytes_kept(once)
    assert grown < 8_000, f"{grown} bytes kept after 500 rounds"
