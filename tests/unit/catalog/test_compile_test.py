"""compile_test(op, type, items, operand) answers as evaluate(op, type, items, operand, v)
for every value: the core featurizes with the compiled form, the normalized catalog and
the naive evaluator with evaluate()."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wakeline.catalog._values import MISSING, compile_test, evaluate

OPS = ["exists", "eq", "in", "gt", "gte", "lt", "lte", "contains_any", "contains_all", "near"]
TYPES = ["string", "boolean", "integer", "number", "datetime", "array"]
ITEMS = ["string", "integer", "number", "boolean", "datetime", None]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from([1.0, 2.5, -0.0, 3.0]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
    st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:00:00", "2026-01-01",
                     "2026-06-01 12:30:00+02:00", "not a date", "a", "b", "deadline"]),
    st.just(datetime(2026, 1, 1, tzinfo=UTC)), st.just(datetime(2026, 1, 1)))  # noqa: DTZ001 (a naive value on purpose)
values = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(st.text(max_size=2),
                                                                          scalars, max_size=2),
                   st.just(MISSING))


def same(op: str, type_: str, items: str | None, operand: object, value: object) -> None:
    try:
        want: object = evaluate(op, type_, items, operand, value)
    except Exception as exc:  # evaluate's own failures (an assert on items) must match
        with pytest.raises(type(exc)):
            compile_test(op, type_, items, operand)(value)
        return
    assert compile_test(op, type_, items, operand)(value) is want, (op, type_, items, operand,
                                                                  value)


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(OPS), st.sampled_from(TYPES), st.sampled_from(ITEMS), values, values)
def test_same_answer_as_evaluate(op, type_, items, operand, value):
    same(op, type_, items, operand, value)


@pytest.mark.parametrize(("op", "type_", "items", "operand", "value"), [
    ("gte", "integer", None, 8, 9),
    ("gte", "integer", None, 8, 8.0),
    ("gte", "integer", None, 8, 7),
    ("gte", "integer", None, 8, True),
    ("gte", "integer", None, 8.0, 8),
    ("gt", "number", None, 1, float("inf")),
    ("lt", "number", None, 2, 1.5),
    ("eq", "string", None, "a", "a"),
    ("eq", "string", None, "a", 1),
    ("eq", "boolean", None, True, 1),
    ("in", "string", None, ["a", 1, "b"], "b"),
    ("in", "string", None, ["a", 1, "b"], "a"),
    ("in", "integer", None, 5, 5),
    ("in", "string", None, "abc", "b"),
    ("lte", "datetime", None, "2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z"),
    ("lte", "datetime", None, "2026-01-02T00:00:00Z", "2026-01-01T00:00:00"),
    ("contains_any", "array", "string", ["deadline"], ["x", "deadline"]),
    ("contains_any", "array", "string", ["deadline"], ["x", 1]),
    ("contains_all", "array", "integer", [1, 2], [2, 1.0, 3]),
    ("eq", "array", "integer", [1, 2], [1, 2]),
    ("eq", "array", None, [1], [1]),
    ("exists", "string", None, True, None),
    ("exists", "string", None, False, MISSING),
    ("exists", "array", "string", True, []),
    ("near", "number", None, 1, 1),
])
def test_edge_cases(op, type_, items, operand, value):
    same(op, type_, items, operand, value)

