"""Small helpers shared by the example derivations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def by_seq(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(records, key=lambda r: r.get("seq", 0))


def content(record: Mapping[str, Any]) -> Mapping[str, Any]:
    value = record.get("content") or {}
    return value if isinstance(value, Mapping) else {}


def live(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Records that are not tombstones, in sequence order."""
    return [r for r in by_seq(records) if not r.get("tombstone")]


def clip(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
