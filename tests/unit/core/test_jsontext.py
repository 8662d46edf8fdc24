"""A keyed record's digest: orjson's fast text must be the canonical encoder's, byte for
byte (every digest in a stored state was computed from that text)."""

from __future__ import annotations

import json
import math
import struct
from collections import OrderedDict
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wakeline.core import plan
from wakeline.core.jsontext import floats_differ
from wakeline.core.plan import Rec, canonical, digest

SPEC = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def spec(value: object) -> bytes:
    return SPEC.encode(value).encode()


floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    # every exponent, so each spelling class (e-05 ... e-09, e+16 ...) is reached
    st.integers(0, 2**64 - 1).map(lambda b: struct.unpack("d", struct.pack("Q", b))[0]),
    st.sampled_from([1e-4, 1e-5, 1.5e-7, 1e15, 1e16, 1e21, 1e22, -0.0, 5e-324]))
scalars = st.one_of(st.none(), st.booleans(), floats,
                    st.integers(-(2**70), 2**70), st.text())
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=3000, deadline=None)
@given(values, st.text())
def test_canonical_is_the_encoders_text(content: object, text: str) -> None:
    assert canonical([content, text]) == spec([content, text])


@pytest.mark.parametrize("value", [
    {"b": 1, "a": [1.5, "x"], "c": {"z": None, "y": True}},   # sorted keys, null
    "\x7f", "tab\there", "é", "🚀", "\x00\x1f",                # DEL, escapes, non-ASCII
    [math.nan, math.inf, -math.inf],                          # orjson writes null
    [1e-5, 2.5e-9, 1e16, 0.1], 2**64, -(2**63) - 1,           # floats, big integers
    {1: "int key"}, OrderedDict(b=1, a=2), (1, 2),            # non-str keys, subclasses
    datetime(2026, 1, 2, tzinfo=UTC), Decimal("1.5"), {"s": {1, 2}},  # default=str
])
def test_canonical_edge_cases(value: object) -> None:
    try:
        expected = spec(value)
    except TypeError as exc:  # what the encoder refuses, canonical refuses alike
        with pytest.raises(TypeError, match=str(exc)[:20]):
            canonical(value)
        return
    assert canonical(value) == expected


def test_the_fast_path_is_taken_for_plain_content(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = plan._CANONICAL

    class Counting:
        def encode(self, value: object) -> str:
            calls.append(value)
            return real.encode(value)

    monkeypatch.setattr(plan, "_CANONICAL", Counting())
    rec = Rec(1, "notes", key="k", content={"title": "hello", "n": 3, "w": 0.5}, text="t")
    assert len(digest(rec)) == 16
    assert calls == []  # orjson wrote it
    digest(Rec(1, "notes", key="k", content={"w": 1e-7}))
    assert len(calls) == 1  # a float below 1e-4: the encoder wrote it


def test_digest_is_unchanged() -> None:
    """The digest of a fixed record, as every earlier version computed it."""
    import hashlib

    rec = Rec(7, "profile", key="main", content={"name": "Mia", "age": 31, "tags": ["a"]},
              text="Mia likes tea")
    body = json.dumps([rec.content, rec.text], sort_keys=True, separators=(",", ":"),
                      default=str).encode()
    assert digest(rec) == hashlib.blake2b(body, digest_size=8).hexdigest()


@pytest.mark.parametrize("data, differs", [
    (b"[0.0001]", False), (b"[0.00001]", True), (b"[1e-7]", True), (b"[1e16]", False),
    (b'["e-1 in a string"]', True),  # a false alarm: the slow path, the same bytes
])
def test_floats_differ(data: bytes, differs: bool) -> None:
    assert floats_differ(data) is differs
