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


# -- the C writer of COPY rows (_ccodec.copy_rows) against _Rows.line -------------------------

def _python_text(items) -> bytes:
    from wakeline.streams.sinks import _Rows

    rows = _Rows()
    return "".join(rows.line(o) for o in items).encode("utf-8")


def test_the_c_rows_are_the_python_rows() -> None:
    import os
    from datetime import UTC, datetime, timedelta

    from hypothesis import given, settings
    from hypothesis import strategies as s

    from wakeline.core.outcomes import Outcome, OutcomeKind
    from wakeline.streams import sinks

    if sinks._c_rows is None:
        assert not os.environ.get("CI"), "wakeline.core._ccodec was not built"
        return
    base = datetime(2026, 12, 6, 23, 0, tzinfo=UTC)
    text = s.text(alphabet=s.sampled_from("ab \t\n\r\\N{}é🚀\x00"), max_size=6)
    values = s.none() | s.booleans() | s.integers(-(2**70), 2**70) | s.floats() | text
    outcomes = s.builds(Outcome, s.sampled_from(list(OutcomeKind)), text,
                        s.integers(0, 2).map(lambda k: base + timedelta(seconds=k)),
                        text, text, s.none() | text, s.none() | text,
                        s.dictionaries(s.text(max_size=3) | s.integers(0, 3), values,
                                       max_size=3))

    @settings(max_examples=1500, deadline=None)
    @given(s.lists(outcomes, max_size=6))
    def check(items):
        assert sinks._c_rows(items, sinks._dumps) == _python_text(items)
        assert sinks.copy_text(sinks._Rows(), items) == _python_text(items)

    check()


def test_what_c_does_not_write_is_left_to_python() -> None:
    from datetime import UTC, datetime

    import pytest

    from wakeline.core.outcomes import Outcome, OutcomeKind
    from wakeline.streams import sinks

    if sinks._c_rows is None:
        return
    at = datetime(2026, 12, 6, tzinfo=UTC)
    ok = Outcome(OutcomeKind.NOOP, "r", at, "w", "e", "d", "t", {"value": 1})

    class Sub(Outcome):
        __slots__ = ()

    for odd in ([Sub(OutcomeKind.NOOP, "r", at, "w", "e")],       # not exactly an Outcome
                [ok, Outcome(OutcomeKind.NOOP, 5, at, "w", "e")],  # a text field not a str
                [Outcome(OutcomeKind.NOOP, "r", "not a datetime", "w", "e")]):
        try:
            expected: object = _python_text(odd)
        except Exception as exc:  # noqa: BLE001 - what Python raises, copy_text raises
            expected = exc
        try:
            c = sinks._c_rows(odd, sinks._dumps)
        except AttributeError:  # the isoformat() Python would call too
            assert isinstance(expected, AttributeError)
            continue
        assert c is None  # left to Python
        if isinstance(expected, Exception):
            with pytest.raises(type(expected)):
                sinks.copy_text(sinks._Rows(), odd)
        else:
            assert sinks.copy_text(sinks._Rows(), odd) == expected
    # a lone surrogate cannot be UTF-8: both refuse it (the writer then goes row by row)
    bad = [Outcome(OutcomeKind.NOOP, "\ud800", at, "w", "e")]
    with pytest.raises(UnicodeEncodeError):
        sinks._c_rows(bad, sinks._dumps)
    with pytest.raises(UnicodeEncodeError):
        _python_text(bad)


def test_the_c_rows_keep_no_memory() -> None:
    from datetime import UTC, datetime

    from tests.unit.leaks import bytes_kept
    from wakeline.core.outcomes import Outcome, OutcomeKind
    from wakeline.streams import sinks

    if sinks._c_rows is None:
        return
    at = datetime(2026, 12, 6, tzinfo=UTC)
    items = [Outcome(OutcomeKind.CENSUS_BELOW, "census 1 < 3", at, "w", f"e{i}", "d", "t",
                     {"value": i}) for i in range(50)]

    def once() -> None:
        assert sinks._c_rows(items, sinks._dumps) is not None
        assert sinks._c_rows([*items, "x"], sinks._dumps) is None

    grown = bytes_kept(once)
    assert grown < 8_000, f"{grown} bytes kept after 500 rounds"
