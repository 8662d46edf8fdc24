"""PostgreSQL text output → the JSON value Debezium's JsonConverter writes.

The relay receives every column as the type's text output (pgoutput tuple data,
or ``col::text`` in a snapshot) and must write what Debezium writes for the same
value with this project's connector settings (``decimal.handling.mode=string``,
``time.precision.mode=adaptive`` (the default), ``binary.handling.mode=bytes``,
schemas disabled):

==================  ==============================================================
type                JSON
==================  ==============================================================
int2/int4/int8/oid  number
bool                true / false
float4/float8       number
numeric             string (plain text, as PostgreSQL prints it)
text/varchar/name   string
json/jsonb          string holding PostgreSQL's own JSON text (``io.debezium.data.Json``)
timestamptz         ``io.debezium.time.ZonedTimestamp``: UTC ISO-8601 with as many
                    fraction digits as the column precision (6 by default), ``Z``
date                days since the epoch
timestamp           µs since the epoch (``MicroTimestamp``; ms when precision <= 3)
time                µs since midnight (``MicroTime``; ms when precision <= 3)
uuid                string
bytea               base64 string
arrays              JSON arrays of the element conversion (NULL elements: null)
==================  ==============================================================

Unknown types pass through as their text output.  Checked against real
Debezium 3.4.3 output in ``tests/integration/test_cdc_contract.py``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

from wakeline.cdc.errors import BadValue

Converter = Callable[[str, int], Any]

_EPOCH_DATE = date(1970, 1, 1)
_TS = re.compile(
    r"^(\d{4,})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?)?( BC)?$"
)


def _int(text: str, typmod: int) -> int:
    return int(text)


def _float(text: str, typmod: int) -> float | str:
    value = float(text)
    # JSON has no NaN/Infinity; JsonConverter would write them as strings.
    if value != value or value in (float("inf"), float("-inf")):
        return text
    return value


def _bool(text: str, typmod: int) -> bool:
    if text == "t":
        return True
    if text == "f":
        return False
    raise BadValue(f"not a boolean: {text!r}")


def _text(text: str, typmod: int) -> str:
    return text


def _precision(typmod: int) -> int:
    return typmod if 0 <= typmod <= 6 else 6


def parse_pg_timestamp(text: str) -> tuple[datetime, int]:
    """Parse PostgreSQL's ISO text output of a timestamp (with or without offset).

    Returns an aware UTC datetime (naive values are read as UTC) and the
    microseconds, which ``datetime`` keeps anyway; raises :class:`BadValue`.
    """
    m = _TS.match(text)
    if m is None or m.group(12):
        raise BadValue(f"not a timestamp Wakeline can represent: {text!r}")
    year, month, day, hh, mm, ss = (int(m.group(i)) for i in range(1, 7))
    frac = m.group(7) or ""
    micros = int(frac.ljust(6, "0")) if frac else 0
    offset = 0
    if m.group(8):
        offset = int(m.group(9)) * 3600 + int(m.group(10) or 0) * 60 + int(m.group(11) or 0)
        if m.group(8) == "-":
            offset = -offset
    try:
        local = datetime(year, month, day, hh, mm, ss, micros, tzinfo=UTC)
    except ValueError as exc:
        raise BadValue(f"not a timestamp Wakeline can represent: {text!r}") from exc
    return local - timedelta(seconds=offset), micros


def zoned(text: str, typmod: int = -1) -> str:
    """timestamptz text → Debezium's ZonedTimestamp string (UTC, fixed fraction width):
    the specification of :func:`zoned_timestamp`, for any offset."""
    if text in ("infinity", "-infinity"):
        return text
    utc, _ = parse_pg_timestamp(text)
    width = _precision(typmod)
    base = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if width:
        base += "." + f"{utc.microsecond:06d}"[:width]
    return base + "Z"


#: PostgreSQL's output of a timestamptz in a session whose TimeZone is UTC (the relay's),
#: years 1000-9999: its ZonedTimestamp is the same digits rearranged
_TS_UTC = re.compile(r"([1-9]\d{3}-\d\d-\d\d) (\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?\+00")


def zoned_timestamp(text: str, typmod: int = -1) -> str:
    """:func:`zoned`, with PostgreSQL's UTC output rearranged instead of parsed (two
    per change of the records table: 6.3 -> ~1 us each)."""
    m = _TS_UTC.fullmatch(text)
    if m is not None:
        try:
            datetime.fromisoformat(text)  # a real date and time of day, as parsing checks
        except ValueError:
            return zoned(text, typmod)  # which says why
        width = _precision(typmod)
        base = f"{m.group(1)}T{m.group(2)}"
        if width:
            base += "." + (m.group(3) or "").ljust(6, "0")[:width]
        return base + "Z"
    return zoned(text, typmod)


def _timestamptz(text: str, typmod: int) -> str:
    return zoned_timestamp(text, typmod)


def _epoch_micros(dt: datetime) -> int:
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _timestamp(text: str, typmod: int) -> int:
    utc, _ = parse_pg_timestamp(text)
    micros = _epoch_micros(utc)
    return micros // 1000 if 0 <= typmod <= 3 else micros


def _date(text: str, typmod: int) -> int:
    try:
        return (date.fromisoformat(text) - _EPOCH_DATE).days
    except ValueError as exc:
        raise BadValue(f"not a date: {text!r}") from exc


def _time(text: str, typmod: int) -> int:
    hh, mm, rest = text.split(":")
    sec, _, frac = rest.partition(".")
    micros = ((int(hh) * 60 + int(mm)) * 60 + int(sec)) * 1_000_000 + int(frac.ljust(6, "0") or 0)
    return micros // 1000 if 0 <= typmod <= 3 else micros


def _bytea(text: str, typmod: int) -> str:
    if not text.startswith("\\x"):
        raise BadValue("bytea not in hex output format")
    return base64.b64encode(bytes.fromhex(text[2:])).decode("ascii")


#: Scalar converters by type OID.
SCALARS: dict[int, Converter] = {
    16: _bool,
    17: _bytea,
    18: _text,
    19: _text,
    20: _int,
    21: _int,
    23: _int,
    25: _text,
    26: _int,
    114: _text,
    700: _float,
    701: _float,
    1042: _text,
    1043: _text,
    1082: _date,
    1083: _time,
    1114: _timestamp,
    1184: _timestamptz,
    1700: _text,
    2950: _text,
    3802: _text,
}

#: Array type OID → element type OID.
ARRAYS: dict[int, int] = {
    1000: 16,
    1001: 17,
    1002: 18,
    1003: 19,
    1005: 21,
    1007: 23,
    1009: 25,
    1014: 1042,
    1015: 1043,
    1016: 20,
    1021: 700,
    1022: 701,
    1028: 26,
    1115: 1114,
    1182: 1082,
    1183: 1083,
    1185: 1184,
    1231: 1700,
    199: 114,
    2951: 2950,
    3807: 3802,
}


def parse_array(text: str) -> list[Any]:
    """Split PostgreSQL's array text output into nested lists of str / None."""
    if text.startswith("["):  # explicit bounds: "[0:1]={1,2}"
        text = text[text.index("=") + 1:]
    pos = 0

    def element_list() -> list[Any]:
        nonlocal pos
        if text[pos] != "{":
            raise BadValue(f"not an array literal: {text!r}")
        pos += 1
        out: list[Any] = []
        if text[pos] == "}":
            pos += 1
            return out
        while True:
            ch = text[pos]
            if ch == "{":
                out.append(element_list())
            elif ch == '"':
                pos += 1
                buf = []
                while text[pos] != '"':
                    if text[pos] == "\\":
                        pos += 1
                    buf.append(text[pos])
                    pos += 1
                pos += 1
                out.append("".join(buf))
            else:
                start = pos
                while text[pos] not in ",}":
                    pos += 1
                raw = text[start:pos].strip()
                out.append(None if raw == "NULL" else raw)
            if text[pos] == ",":
                pos += 1
                continue
            if text[pos] == "}":
                pos += 1
                return out
            raise BadValue(f"not an array literal: {text!r}")

    try:
        result = element_list()
    except IndexError as exc:
        raise BadValue(f"truncated array literal: {text!r}") from exc
    return result


def _map_array(items: list[Any], conv: Converter) -> list[Any]:
    return [
        _map_array(x, conv) if isinstance(x, list) else (None if x is None else conv(x, -1))
        for x in items
    ]


def convert(text: str | None, type_oid: int, typmod: int = -1) -> Any:
    """The JSON value Debezium writes for a column of ``type_oid`` whose text is ``text``.

    :raises BadValue: when the text does not parse as the type says.
    """
    if text is None:
        return None
    scalar = SCALARS.get(type_oid)
    try:
        if scalar is not None:
            return scalar(text, typmod)
        element = ARRAYS.get(type_oid)
        if element is not None:
            return _map_array(parse_array(text), SCALARS.get(element, _text))
    except BadValue:
        raise
    except (ValueError, IndexError) as exc:
        raise BadValue(f"cannot convert {text[:80]!r} (type oid {type_oid}): {exc}") from exc
    return text


def converter_for(type_oid: int, typmod: int = -1) -> Callable[[str | None], Any]:
    """A one-argument converter bound to a column type (hot path of the relay)."""
    scalar = SCALARS.get(type_oid)
    if scalar is _text:
        return lambda text: text
    if scalar is _int:
        return lambda text: None if text is None else int(text)
    if scalar is _timestamptz:
        return lambda text: None if text is None else zoned_timestamp(text, typmod)
    if type_oid in ARRAYS:  # an empty array, the common case, needs no parsing
        return lambda text: [] if text == "{}" else convert(text, type_oid, typmod)
    return lambda text: convert(text, type_oid, typmod)
