"""The compiled, normalized catalog: what the condition engine, workers and API read.

Everything here is a frozen pydantic model with every default filled in, so an
evaluator never re-reads YAML or re-applies defaults:

* ``Catalog.collections[name]`` → :class:`Collection` (versions, declared fields with
  their backing, scorers, annotators with leaf types).
* ``Catalog.derivations[name]`` → :class:`Derivation` (driving :class:`Source` with
  resolved collection versions, callable, emitted collections).
* ``Catalog.triggers[name]`` / ``Catalog.triggers_for(derivation)`` → :class:`Trigger`,
  whose ``conditions`` are a discriminated union on ``kind``.  Each scoped condition
  carries a full :class:`Scope` (collections *with versions*, types, statuses, keyed,
  typed ``where`` predicates).  ``accumulator`` and ``lifecycle`` carry the driving
  source as their scope.  Each where predicate / ``at`` field is a :class:`FieldRef`
  with one :class:`FieldBinding` per scoped collection version that says where the
  value lives (content path or annotation leaf) — ``Scope.matches(record)`` and
  ``FieldRef.lookup(record)`` use them.

Scope defaults: a *consuming* scope (write, changed, retraction, quiet) inherits each
omitted part — collections, types, statuses — from the driving source separately.
An *observational* scope (at, census) inherits the whole source scope when it omits
``collections``; when it names collections, omitted types/statuses mean "any"
(``None``).  ``types``/``statuses`` of ``None`` always mean unrestricted.

Evaluator notes: ``condition.reason`` is the reason string of the seed (accumulator →
``threshold``), and ``Trigger.reason_key(c)`` the mailbox key ``trigger:<name>:<reason>``.
``debounced`` is true on data conditions of a trigger with ``debounce_s`` (settle-style
merge).  Where predicates treat JSON null as absent, and a value of the wrong type
never matches.  Windows: ``size_s`` long, advancing every ``hop_s`` (default: size_s);
an accumulator/census window counts records whose readiness falls inside it.

Semantic hashes (``sha256:<hex>``): sha256 over canonical JSON (sorted keys, no
whitespace) of a definition, leaving out ``hash``, ``file``, ``description``, a
trigger's ``origin`` and YAML locations, with set-like lists (scope
collections/types/statuses, keys, transitions, ``in`` and ``contains_*`` operands)
sorted.  Comments, key order and whitespace therefore do not change a hash; any
semantic edit does — including a new active collection version that re-scopes it.
The catalog hash combines every collection, derivation and trigger hash.

Derivation callable contract
----------------------------
``function: "module:function"`` names ``def fn(ctx) -> list[dict]``, imported with the
catalog directory on ``sys.path``.  ``ctx`` is a :class:`wakeline.catalog.contract.
DerivationContext` with ``workspace``, ``entity``, ``derivation`` (name), ``now``
(aware UTC datetime — never read the wall clock), ``reasons`` (sorted trigger reason
strings) and ``records``: the driving-source rows as dicts with the record columns
``seq, collection, collection_version, type, status, key, content, text, tombstone,
parents, annotations, scores, created_at``.  The function must be deterministic and
side-effect free and returns a list of emissions, each into a collection it ``emits``:

* keyed value — ``{"collection", "key", "content": {...}, "text": "...", "type"?}``
* retraction  — ``{"collection", "key", "retract": True}`` (no text, no content)
* event       — ``{"collection", "type", "content": {...}, "text"?: "..."}``

:func:`wakeline.catalog.contract.validate_emissions` checks a result against this.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from wakeline.catalog import _values
from wakeline.catalog._hashing import Norm
from wakeline.catalog._hashing import canonical_json as canonical_json
from wakeline.catalog._hashing import semantic_hash as semantic_hash
from wakeline.catalog.errors import CatalogIssue
from wakeline.catalog.schema import Aggregate, FieldTypeName, ScalarType, SourceMode, Transition

Op = Literal["exists", "eq", "in", "gt", "gte", "lt", "lte", "contains_any", "contains_all"]


# -- collections -------------------------------------------------------------------


class LeafType(Norm):
    type: FieldTypeName
    items: ScalarType | None = None


class AnnotatorDef(Norm):
    name: str
    required: bool
    leaves: dict[str, LeafType]


class FieldDef(Norm):
    """A declared field of one collection version and where its value lives."""

    name: str
    type: FieldTypeName
    items: ScalarType | None = None
    filterable: bool
    backing: Literal["content", "annotation"]
    #: Dotted path inside ``content`` or inside ``annotations[annotator]``.
    path: str
    annotator: str | None = None
    #: False only for fields backed by an optional annotator.
    required: bool = True
    description: str | None = None


class CollectionVersion(Norm):
    version: int
    consumable: bool = True
    fields: dict[str, FieldDef]


class Collection(Norm):
    name: str
    keyed: bool
    active_version: int
    versions: tuple[CollectionVersion, ...]
    types: tuple[str, ...] | None = None
    keys: tuple[str, ...] | None = None
    scorers: tuple[str, ...] = ()
    annotators: dict[str, AnnotatorDef] = Field(default_factory=dict)
    #: scorer / annotator name → "module:function" (the readiness agent runs them).
    enrichers: dict[str, str] = Field(default_factory=dict)
    hash: str = ""
    file: str = ""
    description: str | None = None

    def version(self, number: int | None = None) -> CollectionVersion:
        """The given version (default: the active one).  KeyError if undeclared."""
        wanted = self.active_version if number is None else number
        for v in self.versions:
            if v.version == wanted:
                return v
        raise KeyError(f"{self.name}@{wanted}")


class CollectionRef(Norm):
    """One collection version, e.g. ``main@2``."""

    collection: str
    version: int
    keyed: bool

    @property
    def ref(self) -> str:
        return f"{self.collection}@{self.version}"

    def __str__(self) -> str:
        return self.ref


# -- fields, predicates, scopes --------------------------------------------------------


class FieldBinding(Norm):
    """How to read one field from a record of one collection version."""

    collection: str
    version: int
    backing: Literal["content", "annotation"]
    path: str
    annotator: str | None = None

    def lookup(self, record: Any) -> Any:
        """The value, or ``_values.MISSING``.  ``record`` is a mapping or a Record."""
        if self.backing == "content":
            return _values.lookup_path(_values.record_attr(record, "content") or {}, self.path)
        annotations = _values.record_attr(record, "annotations") or {}
        assert self.annotator is not None
        return _values.lookup_path(annotations.get(self.annotator, _values.MISSING), self.path)


class FieldRef(Norm):
    """A field as used by a condition: its type across the scope and per-version bindings."""

    name: str
    type: FieldTypeName
    items: ScalarType | None = None
    bindings: tuple[FieldBinding, ...]

    def binding_for(self, collection: str, version: int) -> FieldBinding | None:
        for b in self.bindings:
            if b.collection == collection and b.version == version:
                return b
        return None

    def lookup(self, record: Any) -> Any:
        """The field's value in ``record`` (``_values.MISSING`` if absent or out of scope)."""
        binding = self.binding_for(
            _values.record_attr(record, "collection"),
            _values.record_attr(record, "collection_version"),
        )
        return _values.MISSING if binding is None else binding.lookup(record)


class WherePredicate(Norm):
    field: FieldRef
    op: Op
    #: Canonical operand: datetimes as ISO UTC strings, set-like lists sorted.
    value: Any

    def matches(self, record: Any) -> bool:
        return _values.evaluate(
            self.op, self.field.type, self.field.items, self.value, self.field.lookup(record)
        )


class Scope(Norm):
    collections: tuple[CollectionRef, ...]
    types: tuple[str, ...] | None = None
    statuses: tuple[str, ...] | None = None
    #: True/False when every scoped collection is keyed/event; None when mixed.
    keyed: bool | None = None
    where: tuple[WherePredicate, ...] = ()

    def includes(self, collection: str, version: int) -> bool:
        return any(c.collection == collection and c.version == version for c in self.collections)

    def matches(self, record: Any) -> bool:
        """Does ``record`` (mapping or Record) fall in this scope, where included?"""
        get = _values.record_attr
        if not self.includes(get(record, "collection"), get(record, "collection_version")):
            return False
        if self.types is not None and get(record, "type") not in self.types:
            return False
        if self.statuses is not None and get(record, "status") not in self.statuses:
            return False
        return all(p.matches(record) for p in self.where)


# -- conditions ------------------------------------------------------------------------


class _Condition(Norm):
    #: YAML path of the condition in its file (e.g. ``trigger.write``); not hashed.
    yaml_path: str = ""


class WriteCondition(_Condition):
    kind: Literal["write"] = "write"
    reason: Literal["write"] = "write"
    scope: Scope
    debounced: bool = False


class ChangedCondition(_Condition):
    kind: Literal["changed"] = "changed"
    reason: Literal["changed"] = "changed"
    scope: Scope
    #: None watches every key.
    keys: tuple[str, ...] | None = None
    transitions: tuple[Transition, ...] = ("added", "changed", "removed")
    debounced: bool = False


class RetractionCondition(_Condition):
    kind: Literal["retraction"] = "retraction"
    reason: Literal["retraction"] = "retraction"
    scope: Scope
    debounced: bool = False


class Window(Norm):
    size_s: int
    hop_s: int


class Metric(Norm):
    """``count``; a scorer (``scores[scorer]``); or one leaf of a required annotation."""

    kind: Literal["count", "scorer", "annotation"]
    aggregate: Aggregate
    scorer: str | None = None
    annotator: str | None = None
    path: str | None = None

    def lookup(self, record: Any) -> Any:
        """The per-record value to aggregate (``_values.MISSING`` when absent)."""
        if self.kind == "count":
            return 1
        if self.kind == "scorer":
            scores = _values.record_attr(record, "scores") or {}
            return scores.get(self.scorer, _values.MISSING)
        annotations = _values.record_attr(record, "annotations") or {}
        assert self.annotator is not None and self.path is not None
        return _values.lookup_path(annotations.get(self.annotator, _values.MISSING), self.path)


class AccumulatorCondition(_Condition):
    kind: Literal["accumulator"] = "accumulator"
    reason: Literal["threshold"] = "threshold"
    #: The driving source (an accumulator aggregates exactly what the cursor consumes).
    scope: Scope
    metric: Metric
    threshold: float
    comparison: Literal["gte", "lte"] = "gte"
    window: Window | None = None
    debounced: bool = False


class CensusCondition(_Condition):
    kind: Literal["census"] = "census"
    reason: Literal["census"] = "census"
    scope: Scope
    threshold: int
    window: Window | None = None
    debounced: bool = False


class LifecycleCondition(_Condition):
    kind: Literal["lifecycle"] = "lifecycle"
    reason: Literal["lifecycle"] = "lifecycle"
    scope: Scope
    first_record: bool = False
    total_records: int | None = None
    debounced: bool = False


class QuietCondition(_Condition):
    kind: Literal["quiet"] = "quiet"
    reason: Literal["quiet"] = "quiet"
    scope: Scope
    after_s: int
    max_wait_s: int | None = None


class AtCondition(_Condition):
    kind: Literal["at"] = "at"
    reason: Literal["at"] = "at"
    scope: Scope
    field: FieldRef
    offset_s: int = 0


class CronCondition(_Condition):
    kind: Literal["cron"] = "cron"
    reason: Literal["cron"] = "cron"
    expr: str
    entities: Literal["dirty", "any"] = "dirty"


class ReadCondition(_Condition):
    kind: Literal["read"] = "read"
    reason: Literal["read"] = "read"


Condition = Annotated[
    WriteCondition
    | ChangedCondition
    | RetractionCondition
    | AccumulatorCondition
    | CensusCondition
    | LifecycleCondition
    | QuietCondition
    | AtCondition
    | CronCondition
    | ReadCondition,
    Field(discriminator="kind"),
]

#: Conditions that debounce_s applies to.
DATA_KINDS = frozenset({"write", "accumulator", "changed", "retraction", "census", "lifecycle"})
#: Conditions whose scope the driving source must consume.
CONSUMING_KINDS = frozenset({"write", "changed", "retraction", "quiet"})


class Trigger(Norm):
    name: str
    derivation: str
    origin: Literal["inline", "standalone"]
    conditions: tuple[Condition, ...]
    cooldown_s: int | None = None
    debounce_s: int | None = None
    max_wait_s: int | None = None
    hash: str = ""
    file: str = ""
    description: str | None = None
    _non_semantic: ClassVar[frozenset[str]] = Norm._non_semantic | {"origin"}

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(c.kind for c in self.conditions)

    def condition(self, kind: str) -> Condition | None:
        for c in self.conditions:
            if c.kind == kind:
                return c
        return None

    def reason_key(self, condition: Condition | str) -> str:
        """The mailbox reason, e.g. ``trigger:profile.default:threshold``."""
        if isinstance(condition, str):
            found = self.condition(condition)
            if found is None:
                raise KeyError(f"trigger {self.name} has no {condition} condition")
            condition = found
        return f"trigger:{self.name}:{condition.reason}"


# -- derivations ---------------------------------------------------------------------------


class Source(Norm):
    collections: tuple[CollectionRef, ...]
    types: tuple[str, ...] | None = None
    statuses: tuple[str, ...] | None = None
    mode: SourceMode = "changes"
    allow_empty: bool = False

    @property
    def scope(self) -> Scope:
        keyed = {c.keyed for c in self.collections}
        return Scope(
            collections=self.collections, types=self.types, statuses=self.statuses,
            keyed=keyed.pop() if len(keyed) == 1 else None,
        )


class Derivation(Norm):
    name: str
    source: Source
    function: str
    emits: tuple[CollectionRef, ...] = ()
    timeout_s: int = 300
    hash: str = ""
    file: str = ""
    description: str | None = None

    @property
    def module(self) -> str:
        return self.function.partition(":")[0]

    @property
    def attr(self) -> str:
        return self.function.partition(":")[2]


class Catalog(Norm):
    """A compiled catalog.  Build it with :func:`wakeline.catalog.compile_catalog`."""

    root: str
    hash: str = ""
    collections: dict[str, Collection]
    derivations: dict[str, Derivation]
    triggers: dict[str, Trigger]
    warnings: tuple[CatalogIssue, ...] = ()
    _non_semantic: ClassVar[frozenset[str]] = Norm._non_semantic | {"root", "warnings"}

    def triggers_for(self, derivation: str) -> tuple[Trigger, ...]:
        """Every trigger that targets ``derivation``, sorted by name."""
        return tuple(t for _, t in sorted(self.triggers.items()) if t.derivation == derivation)

    def load_function(self, derivation: str) -> Callable[..., Any]:
        """Import the derivation's callable with the catalog directory on sys.path."""
        from wakeline.catalog._functions import resolve_callable

        return resolve_callable(self.root, self.derivations[derivation].function)

    def to_dict(self) -> dict[str, Any]:
        """The normalized catalog as JSON data (the body of ``GET /triggers``)."""
        data = self.model_dump(mode="json")
        data["triggers"] = {k: data["triggers"][k] for k in sorted(data["triggers"])}
        return data

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Catalog:
        return cls.model_validate_json(text)
