"""PostgreSQL text output → the JSON value Debezium writes (checked against real output)."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wakeline.cdc.errors import BadValue
from wakeline.cdc.values import convert, converter_for, parse_array, zoned, zoned_timestamp


@pytest.mark.parametrize("text, typmod, expected", [
    # Debezium's ZonedTimestamp: UTC, six fraction digits (column precision), Z.
    ("2024-01-01 00:00:00+00", -1, "2024-01-01T00:00:00.000000Z"),
    ("2024-01-01 00:00:00.5+00", -1, "2024-01-01T00:00:00.500000Z"),
    ("2024-01-01 00:00:00.12345+00", -1, "2024-01-01T00:00:00.123450Z"),
    ("2024-06-01 10:00:00.000001+02", -1, "2024-06-01T08:00:00.000001Z"),
    ("2024-01-01 00:00:00.25+05:30", -1, "2023-12-31T18:30:00.250000Z"),
    ("1900-01-01 00:00:00-00:09:21", -1, "1900-01-01T00:09:21.000000Z"),
    ("2024-01-01 00:00:00.123+00", 3, "2024-01-01T00:00:00.123Z"),
    ("2024-01-01 00:00:07.9+00", 0, "2024-01-01T00:00:07Z"),
    ("infinity", -1, "infinity"),
])
def test_timestamptz_as_zoned_timestamp(text: str, typmod: int, expected: str) -> None:
    assert zoned_timestamp(text, typmod) == expected
    assert convert(text, 1184, typmod) == expected


@pytest.mark.parametrize("text, oid, expected", [
    ("42", 20, 42), ("-7", 23, -7), ("3", 21, 3),
    ("t", 16, True), ("f", 16, False),
    ("1.5", 701, 1.5), ("NaN", 701, "NaN"),
    ("12.3400", 1700, "12.3400"),
    ('{"a": [1, 2]}', 3802, '{"a": [1, 2]}'),  # jsonb stays PostgreSQL's JSON text
    ("{}", 114, "{}"),
    ("hello\x01", 25, "hello\x01"),
    ("{1,2,3}", 1016, [1, 2, 3]), ("{}", 1016, []), ("{NULL,5}", 1016, [None, 5]),
    ('{a,"b c","d\\"e",NULL,"NULL"}', 1009, ["a", "b c", 'd"e', None, "NULL"]),
    ("{{1,2},{3,4}}", 1007, [[1, 2], [3, 4]]),
    ("{t,f}", 1000, [True, False]),
    ("1970-01-03", 1082, 2),
    ("1970-01-01 00:00:01.5", 1114, 1_500_000),
    ("01:00:00.25", 1083, 3_600_250_000),
    ("\\x0102ff", 17, "AQL/"),
    ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", 2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("(1,2)", 600, "(1,2)"),  # an unknown type passes through as text
    (None, 20, None),
])
def test_scalars_and_arrays(text: str | None, oid: int, expected: object) -> None:
    assert convert(text, oid) == expected


def test_array_with_explicit_bounds() -> None:
    assert parse_array("[0:1]={7,8}") == ["7", "8"]


@pytest.mark.parametrize("text, oid", [
    ("maybe", 16), ("{1,2", 1016), ("not a time", 1184), ("2024-13-01 00:00:00+00", 1184),
    ("12x", 20), ("0001-01-01 00:00:00+00 BC", 1184),
])
def test_bad_text_raises_bad_value(text: str, oid: int) -> None:
    with pytest.raises(BadValue):
        convert(text, oid)


# PostgreSQL's UTC output, as the relay's session writes it, and what is near it: the
# fast path (rearranging the digits) must answer exactly as parsing does (`zoned`), and
# reject exactly what parsing rejects.
_UTC_TEXT = st.builds(
    lambda d, frac, sep, tail: f"{d:%Y-%m-%d}{sep}{d:%H:%M:%S}{frac}{tail}",
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),  # noqa: DTZ001 - naive: only its digits are written
    st.sampled_from(["", ".5", ".12", ".000001", ".123450", ".999999", ".1234567"]),
    st.sampled_from([" ", "T"]),
    st.sampled_from(["+00", "+00:00", "-00", "+02", "-03:30", "", "+00 BC", "Z"]))
_DAMAGED = st.builds(lambda t, i, c: t[:i] + c + t[i + 1:], _UTC_TEXT,
                     st.integers(0, 25), st.sampled_from(list("0123456789:-. +x")))


@settings(max_examples=3000, deadline=None)
@given(st.one_of(_UTC_TEXT, _DAMAGED), st.sampled_from([-1, 0, 1, 3, 6]))
def test_the_utc_fast_path_answers_as_parsing_does(text: str, typmod: int) -> None:
    try:
        expected: object = zoned(text, typmod)
    except BadValue:
        expected = BadValue
    try:
        got: object = zoned_timestamp(text, typmod)
    except BadValue:
        got = BadValue
    assert got == expected, text


@pytest.mark.parametrize("text", ["2026-02-30 00:00:00+00", "2026-13-01 00:00:00+00",
                                  "2026-01-01 24:00:00+00", "2026-01-01 23:60:00+00"])
def test_an_impossible_utc_instant_is_a_bad_value(text: str) -> None:
    with pytest.raises(BadValue):
        zoned_timestamp(text)
    with pytest.raises(BadValue):
        convert(text, 1184)


@pytest.mark.parametrize("oid", [1016, 1009, 1007, 1185, 1000, 1231])
@pytest.mark.parametrize("text", ["{}", "[0:1]={}", "{NULL}", "{}x", None])
def test_a_column_converter_answers_as_convert(oid: int, text: str | None) -> None:
    def outcome(fn: object) -> object:
        try:
            return fn()  # type: ignore[operator]
        except BadValue:
            return BadValue
    assert outcome(lambda: converter_for(oid)(text)) == outcome(lambda: convert(text, oid))
