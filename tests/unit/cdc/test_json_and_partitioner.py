"""Keys are byte-identical to Kafka Connect's JsonConverter and partition like Java."""

from __future__ import annotations

import json

import pytest

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
