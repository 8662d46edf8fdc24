"""The contract between the runtime and a derivation callable.

A derivation's ``function: "module:function"`` is ``def fn(ctx: DerivationContext)
-> list[Emission]``.  The runtime (the derive worker) builds the context from the
driving source and co-commits the returned emissions with the watermark advance.
The callable must be deterministic and free of side effects: it reads ``ctx.now``,
never the wall clock, and does no I/O — the same inputs give the same emissions, so
a redelivered job is harmless.

Records are dicts with the record columns: ``seq, collection, collection_version,
type, status, key, content, text, tombstone, parents, annotations, scores,
created_at`` (``created_at`` an aware datetime).  Emissions:

* keyed value: ``{"collection": c, "key": k, "content": {...}, "text": "...",
  "type"?: t}`` — into a keyed collection; becomes the new head of (entity, c, k).
* retraction:  ``{"collection": c, "key": k, "retract": True}`` — the runtime writes
  the tombstone (parent: the live head); supply neither text nor content.
* event:       ``{"collection": c, "type": t, "content": {...}, "text"?: "..."}`` —
  into an event (``keyed: false``) collection.

An empty list is a valid result (nothing to write; the watermark still advances).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NotRequired, TypedDict

from wakeline.catalog.errors import InvalidEmission
from wakeline.catalog.normalized import Catalog, Derivation

__all__ = [
    "DerivationContext",
    "EventEmission",
    "KeyedEmission",
    "Retraction",
    "validate_emissions",
]


@dataclass(frozen=True)
class DerivationContext:
    """What a derivation callable receives.  Immutable; build one per run."""

    entity: str
    derivation: str
    now: datetime
    records: Sequence[Mapping[str, Any]] = ()
    workspace: str = "default"
    reasons: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


class KeyedEmission(TypedDict):
    collection: str
    key: str
    content: dict[str, Any]
    text: str
    type: NotRequired[str]


class Retraction(TypedDict):
    collection: str
    key: str
    retract: bool


class EventEmission(TypedDict):
    collection: str
    type: str
    content: dict[str, Any]
    text: NotRequired[str]


_KEYED_KEYS = {"collection", "key", "content", "text", "type"}
_EVENT_KEYS = {"collection", "type", "content", "text"}


def validate_emissions(
    catalog: Catalog, derivation: Derivation | str, emissions: Any
) -> list[dict[str, Any]]:
    """Check a callable's result against the contract; InvalidEmission names the problem."""
    d = catalog.derivations[derivation] if isinstance(derivation, str) else derivation
    if not isinstance(emissions, list | tuple):
        raise InvalidEmission(
            f"derivation {d.name} returned {type(emissions).__name__}; return a list of "
            "emission dicts (an empty list when there is nothing to write)",
            derivation=d.name,
        )
    emitted = {ref.collection for ref in d.emits}
    out: list[dict[str, Any]] = []
    for i, item in enumerate(emissions):
        where = f"derivation {d.name}, emission [{i}]"

        def bad(msg: str, where: str = where, index: int = i) -> InvalidEmission:
            return InvalidEmission(f"{where}: {msg}", derivation=d.name, index=index)

        if not isinstance(item, Mapping):
            raise bad(f"is a {type(item).__name__}; emit a dict")
        coll = item.get("collection")
        if coll not in emitted:
            raise bad(
                f"collection {coll!r} is not in the derivation's emits "
                f"{sorted(emitted)}; add it to `emits:` or emit into one of those"
            )
        keyed = catalog.collections[coll].keyed
        keys = set(item)
        if item.get("retract"):
            if not keyed:
                raise bad(f"retract needs a keyed collection; {coll} is an event collection")
            if keys != {"collection", "key", "retract"} or not _nonempty_str(item.get("key")):
                raise bad("a retraction is exactly {collection, key, retract: true}")
        elif keyed:
            if not keys <= _KEYED_KEYS or not _nonempty_str(item.get("key")):
                raise bad(f"a keyed emission has keys {sorted(_KEYED_KEYS)} and a non-empty key")
            if not isinstance(item.get("content"), Mapping) or not isinstance(
                item.get("text"), str
            ):
                raise bad("a keyed emission needs content (a dict) and text (a string)")
            if "tombstone" in item["content"]:
                raise bad("content may not set tombstone; emit retract: true instead")
        else:
            if not keys <= _EVENT_KEYS or not _nonempty_str(item.get("type")):
                raise bad(f"an event emission has keys {sorted(_EVENT_KEYS)} and a type")
            if not isinstance(item.get("content"), Mapping):
                raise bad("an event emission needs content (a dict)")
            if "text" in item and not isinstance(item["text"], str):
                raise bad("text must be a string")
        out.append(dict(item))
    return out


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value)
