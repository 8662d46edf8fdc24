"""Typed values of declared fields: operand checks, record lookups, predicate tests.

One module owns the meaning of a field type so the compiler (which checks where
operands) and evaluators (which test records) cannot disagree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
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
