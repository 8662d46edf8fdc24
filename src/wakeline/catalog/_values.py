"""Typed values of declared fields: operand checks, record lookups, predicate tests.

One module owns the meaning of a field type so the compiler (which checks where
operands) and evaluators (which test records) cannot disagree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from typing import Any

MISSING: Any = object()

NUMERIC = frozenset({"number", "integer"})
ORDERED = frozenset({"number", "integer", "datetime", "string"})


class Mismatch(ValueError):
    """A value does not fit a declared type."""


#: The datetime grammar (docs/semantics.md, where predicates): the RFC 3339 profile
#: of ISO 8601 — extended date, ``T``/``t``/space, hh:mm[:ss[.f{1,6}]], then ``Z`` or
#: ±hh[[:]mm] — or the basic form ``YYYYMMDDThhmmss[.f](Z|±hh[mm])``.  Week and
#: ordinal dates, hour-only times, padding and 7+ fraction digits are not instants.
_INSTANT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]"
    r"(:[0-5][0-9](\.[0-9]{1,6})?)?([Zz]|[+-]([01][0-9]|2[0-3])(:?[0-5][0-9])?)"
    r"|[0-9]{8}[Tt]([01][0-9]|2[0-3])[0-5][0-9][0-5][0-9]"
    r"(\.[0-9]{1,6})?([Zz]|[+-]([01][0-9]|2[0-3])([0-5][0-9])?)")
_NAIVE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}([Tt ]([01][0-9]|2[0-3]):[0-5][0-9]"
                    r"(:[0-5][0-9](\.[0-9]{1,6})?)?)?")


def parse_datetime(value: Any, *, require_tz: bool) -> datetime:
    """An aware UTC datetime from a datetime or a string in the datetime grammar."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        if _INSTANT.fullmatch(value) is None:
            if _NAIVE.fullmatch(value) is not None and require_tz:
                raise Mismatch(f"{value!r} has no timezone; add one, e.g. a trailing Z for UTC")
            if _NAIVE.fullmatch(value) is None:
                raise Mismatch(f"{value!r} is not an ISO 8601 datetime "
                               "(e.g. 2026-07-19T09:00:00Z)")
        text = value.upper().replace(" ", "T")
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            dt = datetime.fromisoformat(text)
        except ValueError as exc:
            raise Mismatch(f"{value!r} is not an ISO 8601 datetime") from exc
    elif isinstance(value, date):
        raise Mismatch(f"{value!r} is a date without a time; write e.g. {value}T00:00:00Z")
    else:
        raise Mismatch(f"{value!r} is not a datetime")
    if dt.tzinfo is None:
        if require_tz:
            raise Mismatch(f"{value!r} has no timezone; add one, e.g. a trailing Z for UTC")
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def format_datetime(dt: datetime) -> str:
    text = dt.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


def article(type_: str) -> str:
    return f"an {type_}" if type_[0] in "aeiou" else f"a {type_}"


def coerce(type_: str, value: Any, *, operand: bool = False) -> Any:
    """``value`` as a comparable Python value of scalar ``type_`` (Mismatch if it is not).

    Operands (``operand=True``) are stricter: datetimes need a timezone.
    """
    if type_ == "string":
        if isinstance(value, str):
            return value
    elif type_ == "boolean":
        if isinstance(value, bool):
            return value
    elif type_ == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if not operand and isinstance(value, float) and value.is_integer():
            return int(value)
    elif type_ == "number":
        if isinstance(value, int | float) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise Mismatch(f"{value!r} is not a finite number")
            return value
    elif type_ == "datetime":
        # An instant needs a zone, in operands and in records alike: a naive value
        # is not an instant (and `at` deadlines reject it the same way).
        return parse_datetime(value, require_tz=True)
    raise Mismatch(f"{value!r} is not {article(type_)}")


def normalize_operand(type_: str, value: Any) -> Any:
    """The canonical JSON form of an operand of scalar ``type_`` (for hashing/export)."""
    coerced = coerce(type_, value, operand=True)
    if type_ == "datetime":
        return format_datetime(coerced)
    if type_ == "number" and isinstance(coerced, float) and coerced.is_integer():
        return int(coerced)
    return coerced


def sort_key(value: Any) -> tuple[str, Any]:
    return (type(value).__name__, value)


def lookup_path(root: Any, dotted: str) -> Any:
    """Walk ``a.b.c`` through nested mappings; MISSING when any step is absent."""
    node = root
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def record_attr(record: Any, name: str, default: Any = None) -> Any:
    """Read ``name`` from a record given as a mapping or as an object with attributes."""
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def evaluate(op: str, type_: str, items: str | None, operand: Any, value: Any) -> bool:
    """Does a record value satisfy ``op operand``?  ``value`` is MISSING when absent.

    JSON null counts as absent.  A value of the wrong type never matches (it is a
    data problem, not a reason to fire).
    """
    present = value is not MISSING and value is not None
    if op == "exists":
        return present is bool(operand)
    if not present:
        return False
    try:
        if type_ == "array":
            if not isinstance(value, list):
                return False
            assert items is not None
            elements = [coerce(items, v) for v in value]
            wanted = [coerce(items, v) for v in operand]
            if op == "eq":
                return elements == wanted
            if op == "contains_any":
                return any(w in elements for w in wanted)
            if op == "contains_all":
                return all(w in elements for w in wanted)
            return False
        got = coerce(type_, value)
        if op == "eq":
            return bool(got == coerce(type_, operand))
        if op == "in":
            return any(got == coerce(type_, o) for o in operand)
        other = coerce(type_, operand)
        if op == "gt":
            return bool(got > other)
        if op == "gte":
            return bool(got >= other)
        if op == "lt":
            return bool(got < other)
        if op == "lte":
            return bool(got <= other)
    except (Mismatch, TypeError):
        return False
    return False


#: the Python type a record value of a scalar field type already has when
#: ``coerce`` would return it unchanged (a float of a ``number`` still goes through
#: ``coerce``: it must be finite)
_AS_IS = {"string": str, "boolean": bool, "integer": int, "number": int}
_COMPARE = {"eq": lambda a, b: bool(a == b), "gt": lambda a, b: bool(a > b),
            "gte": lambda a, b: bool(a >= b), "lt": lambda a, b: bool(a < b),
            "lte": lambda a, b: bool(a <= b)}


def compile_test(op: str, type_: str, items: str | None, operand: Any) -> Callable[[Any], bool]:
    """``evaluate(op, type_, items, operand, ·)`` as a one-argument function, with the
    operand coerced once instead of per record.  Same answer for every value
    (tests/unit/catalog/test_compile_test.py); forms it does not specialize keep
    calling :func:`evaluate`."""

    def generic(value: Any) -> bool:
        return evaluate(op, type_, items, operand, value)

    if op == "exists":
        want = bool(operand)
        return lambda value: (value is not MISSING and value is not None) is want
    try:
        if type_ == "array":
            if items is None or op not in ("eq", "contains_any", "contains_all"):
                return generic
            wanted = [coerce(items, v) for v in operand]
        elif op == "in":
            # evaluate() coerces the options lazily and answers False at the first
            # that does not coerce: only the ones before it can ever match.
            options = []
            for o in operand:
                try:
                    options.append(coerce(type_, o))
                except (Mismatch, TypeError):
                    break
        elif op in _COMPARE:
            other = coerce(type_, operand)
        else:
            return generic
    except (Mismatch, TypeError):
        return generic
    if type_ == "array":
        return _array_test(op, items, wanted)  # type: ignore[arg-type]
    as_is = _AS_IS.get(type_)

    def scalar(value: Any) -> Any:
        """The coerced value, or MISSING when it is absent or of another type."""
        if type(value) is as_is:
            return value
        if value is MISSING or value is None:
            return MISSING
        try:
            return coerce(type_, value)
        except (Mismatch, TypeError):
            return MISSING

    if op == "in":
        def test_in(value: Any) -> bool:
            got = scalar(value)
            if got is MISSING:
                return False
            try:
                return any(got == o for o in options)
            except TypeError:
                return False
        return test_in
    compare = _COMPARE[op]

    def test(value: Any) -> bool:
        got = scalar(value)
        if got is MISSING:
            return False
        try:
            return compare(got, other)
        except TypeError:
            return False
    return test


def _array_test(op: str, items: str, wanted: list[Any]) -> Callable[[Any], bool]:
    as_is = _AS_IS.get(items)

    def elements(value: Any) -> list[Any] | None:
        if not isinstance(value, list):
            return None
        for v in value:
            if type(v) is not as_is:  # some element needs coerce (or fails it)
                try:
                    return [coerce(items, v) for v in value]
                except (Mismatch, TypeError):
                    return None
        return value  # coerce would return every element as it is

    def test(value: Any) -> bool:
        got = elements(value)
        if got is None:
            return False
        try:
            if op == "eq":
                return got == wanted
            if op == "contains_any":
                for w in wanted:
                    if w in got:
                        return True
                return False
            for w in wanted:
                if w not in got:
                    return False
            return True
        except TypeError:
            return False
    return test
