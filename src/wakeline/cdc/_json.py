"""JSON text exactly as Kafka Connect's JsonConverter (Jackson) writes it.

Compact (no spaces), characters of the Basic Multilingual Plane as raw UTF-8,
characters beyond it (emoji, …) as escaped UTF-16 surrogate pairs
``\\uD83D\\uDE80`` (Jackson's UTF8JsonGenerator does not combine surrogates
by default), control characters as ``\\b \\t \\n \\f \\r`` or ``\\u00XX``,
hex digits UPPER-case (Jackson's ``CharTypes``), ``/`` and DEL unescaped.
Python's encoder differs in the hex case and the astral characters, which this
module fixes, so a key the relay writes is byte-identical to the key Debezium
writes for the same row (and lands on the same partition).

:func:`dumps` is the specification; :func:`dumpb`, the relay's hot path (a change
envelope and its key per change), writes the same bytes with orjson (~10x faster than
the ``json`` encoder), fixing the same two differences, and takes :func:`dumps` for
what orjson cannot write (integers beyond 64 bits, non-string keys) or writes
differently (floats below 1e-4, which Python's ``repr`` spells ``1e-05`` … ``1e-09``).
Both expect finite floats: JSON has no NaN or infinity (the relay's converters write
them as text, as JsonConverter does); ``dumps`` raises on one, orjson would write
``null``.

:func:`loads` reads JSON with orjson (a change envelope holds about nine JSON
texts, counting the JSON columns, and ``json.loads`` cost ~6 us of Python per
text), falling back to ``json.loads`` for what orjson refuses and Python accepts
(integers beyond 64 bits, ``NaN``), so both accept the same documents.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from wakeline.core.jsontext import floats_differ

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# A run of backslashes, then u00 and a control-character code with a-f in it.
# An odd run means the last backslash starts an escape; an even run is literal
# backslashes followed by the text "u00..".
_LOWER_ESCAPE = re.compile(r"(\\+)u00([01][a-f])")


def _upper(match: re.Match[str]) -> str:
    slashes, code = match.group(1), match.group(2)
    if len(slashes) % 2 == 0:
        return match.group(0)
    return f"{slashes}u00{code.upper()}"


_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")


def _surrogates(match: re.Match[str]) -> str:
    code = ord(match.group(0)) - 0x10000
    return f"\\u{0xD800 + (code >> 10):04X}\\u{0xDC00 + (code & 0x3FF):04X}"


def dumps(value: Any) -> str:
    """Compact JSON text, Jackson-compatible."""
    return _jackson(_ENCODER.encode(value))


def _jackson(text: str) -> str:
    """Python's (or orjson's) JSON text with Jackson's two differences applied."""
    if "\\u00" in text:
        text = _LOWER_ESCAPE.sub(_upper, text)
    if not text.isascii():
        text = _ASTRAL.sub(_surrogates, text)
    return text


# What _jackson() would change: a lower-case control escape, an astral character's lead byte.
_LOWER_ESCAPE_B = re.compile(rb"\\u00[01][a-f]")
_ASTRAL_LEAD = re.compile(rb"[\xf0-\xf4]")


def dumpb(value: Any) -> bytes:
    """:func:`dumps` as UTF-8 bytes, the same bytes (by orjson where it can)."""
    try:
        data = orjson.dumps(value)
    except TypeError:  # integers beyond 64 bits, non-string keys, lone surrogates, ...
        return dumps(value).encode("utf-8")
    if floats_differ(data):  # a float below 1e-4: left to dumps()
        return dumps(value).encode("utf-8")
    if _LOWER_ESCAPE_B.search(data) or (not data.isascii() and _ASTRAL_LEAD.search(data)):
        return _jackson(data.decode("utf-8")).encode("utf-8")
    return data


def loads(text: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON text; raises :class:`json.JSONDecodeError` (a ``ValueError``)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8")  # UnicodeDecodeError is a ValueError too
        return json.loads(text)
