"""Keys are byte-identical to Kafka Connect's JsonConverter and partition like Java."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.cdc import samples
from wakeline.cdc._json import dumpb, dumps
from wakeline.cdc.partitioner import murmur2, partition_for


@pytest.mark.parametrize("value, expected", [
    ({"workspace": "default", "entity": "user:mia"}, '{"workspace":"default","entity":"user:mia"}'),
    ("é☃", '"é☃"'),                     # the BMP: raw UTF-8
    ("🚀", '"\\uD83D\\uDE80"'),          # beyond it: escaped surrogates, upper case
    ("\x01\x1f\n\t\b\f\r", '"\\u0001\\u001F\\n\\t\\b\\f\\r"'),
    ("back\\slash \\u001f", '"back\\\\slash \\\\u001f"'),  # literal text stays as it is
    ('q"/\x7f', '"q\\"/\x7f"'),
    ([1, None, True, 2.5], "[1,null,true,2.5]"),
])
def test_jackson_compatible_text(value: object, expected: str) -> None:
    assert dumps(value) == expected
    assert json.loads(dumps(value)) == value


def test_keys_of_real_debezium_messages_are_reproduced_byte_for_byte() -> None:
    for m in samples.messages():
        key = m["key"].encode()
        assert dumpb(json.loads(key)) == key


@pytest.mark.parametrize("data, expected", [
    # Kafka's own test vectors (UtilsTest.testMurmur2).
    (b"21", -973932308), (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
])
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_partitions_of_real_debezium_messages() -> None:
    for m in samples.messages():
        assert partition_for(m["key"].encode(), 4) == m["partition"]
    with pytest.raises(ValueError):
        partition_for(b"x", 0)


# dumpb (orjson, the relay's hot path) against dumps (the specification): the same bytes
# for every JSON value, control characters, astral text and floats of every size included.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"))
    | st.sampled_from(["\x0b\x1f", "🚀x", "\\u001f", "e-7"]),
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=8), inner, max_size=5),
    max_leaves=20)


@settings(max_examples=3000, deadline=None)
@given(_JSON)
def test_dumpb_writes_the_bytes_dumps_writes(value: object) -> None:
    assert dumpb(value) == dumps(value).encode("utf-8")


@settings(max_examples=3000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False)
       | st.floats(min_value=1e-11, max_value=1e-3) | st.floats(min_value=1e14, max_value=1e18))
def test_every_float_orjson_spells_unlike_python_is_left_to_dumps(x: float) -> None:
    assert dumpb([x]) == f"[{x!r}]".encode()
    assert dumpb({"k": -x}) == f'{{"k":{-x!r}}}'.encode()


@pytest.mark.parametrize("value", [{1: "int key"}, [2**64], {"a": [10**30, 1e-7, 0.00001]}])
def test_what_orjson_cannot_or_would_spell_otherwise_takes_the_specification(value: object
                                                                             ) -> None:
    assert dumpb(value) == dumps(value).encode("utf-8")
