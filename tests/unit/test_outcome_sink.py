"""How the outcome writer serializes an outcome's detail for COPY."""

from __future__ import annotations

import json

from wakeline.streams.sinks import _dumps


def test_details_serialize_as_the_same_json_python_would_write() -> None:
    for detail in ({"value": 3.5, "threshold": 10.0, "comparison": "gte", "records": 2},
                   {"census": [1, 2], "who": "mïa 🚀", "none": None}, {}):
        assert json.loads(_dumps(detail)) == detail


def test_what_orjson_refuses_falls_back_to_json_dumps() -> None:
    big = {"value": 2**70, 3: "int key"}
    assert json.loads(_dumps(big)) == {"value": 2**70, "3": "int key"}


def _per_field(o) -> str:
    """The COPY line built field by field (each through _text): what _Rows.line gives."""
    from wakeline.streams.sinks import _text

    d = _dumps(o.detail) if o.detail else "{}"
    dj = _text(d.decode() if isinstance(d, bytes) else d)
    return "\t".join((_text(o.workspace), _text(o.derivation), _text(o.trigger),
                      _text(o.entity), _text(o.kind), _text(o.reason), dj,
                      o.at.isoformat())) + "\n"


def test_a_copy_line_escapes_exactly_what_copy_text_needs() -> None:
    from datetime import UTC, datetime

    from hypothesis import given, settings
    from hypothesis import strategies as s

    from wakeline.core.outcomes import Outcome, OutcomeKind
    from wakeline.streams.sinks import _Rows

    at = datetime(2026, 12, 6, 23, 0, tzinfo=UTC)
    text = s.text(alphabet=s.sampled_from("ab \t\n\r\\N{}é🚀"), max_size=6)
    rows = _Rows()

    @settings(max_examples=2000, deadline=None)
    @given(text, s.none() | text, s.none() | text, text, s.sampled_from(list(OutcomeKind)),
           text, s.dictionaries(text, s.integers() | text, max_size=2))
    def check(ws, dv, tr, en, kind, reason, detail):
        o = Outcome(kind, reason, at, ws, en, dv, tr, detail)
        assert rows.line(o) == _per_field(o)

    check()
    plain = Outcome(OutcomeKind.CENSUS_BELOW, "census 1 < threshold 3", at, "w", "e", "d", "t",
                    {"value": 1})
    assert rows.line(plain) == 'w\td\tt\te\tcensus_below\tcensus 1 < threshold 3\t' \
                               '{"value":1}\t2026-12-06T23:00:00+00:00\n'
