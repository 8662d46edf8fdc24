"""Where orjson's JSON text differs from Python's ``json`` encoder.

Hot paths that need the encoder's exact text (a relay envelope, a keyed record's
content digest) write with orjson, about ten times faster, and take the encoder's
text only when orjson's could differ.  For JSON values (dicts with string keys,
lists, strings, 64-bit integers, finite floats, booleans, null) the two write the
same compact text except for:

- floats below 1e-4, which ``repr`` spells ``1e-05`` … ``1e-09`` and orjson
  ``0.00001`` … ``1e-9`` (:func:`floats_differ`);
- NaN and the infinities, which orjson writes as ``null``;
- non-ASCII characters and DEL, which the encoder escapes when ``ensure_ascii``.

Everything orjson cannot write at all (integers beyond 64 bits, non-string keys,
other types) raises ``TypeError``.  tests/unit/core/test_jsontext.py compares both
over generated values.
"""

from __future__ import annotations

import re

# orjson's spelling of a float below 1e-4: "1e-7" or "0.00001".  The pattern may also
# match inside a string: that sends a value to the slow path, never changes bytes.
_FLOAT_E = re.compile(rb"e-\d")


def floats_differ(data: bytes) -> bool:
    """Whether orjson's ``data`` may spell a float otherwise than ``repr`` does."""
    return b"0.0000" in data or _FLOAT_E.search(data) is not None
