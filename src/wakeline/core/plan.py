"""The evaluation plan: the normalized catalog compiled for the condition core.

A :class:`Plan` holds, per derivation, its driving-source scope and the
conditions of every trigger targeting it, each with a global index (``cid``).
The core featurizes each record once (:meth:`Plan.featurize`): which driving
sources it belongs to and, for every condition whose scope it matches, a value
(``True`` for a scope match, the metric value for an accumulator, the deadline
for ``at``).  Conditions then fold over these small facts, never over raw rows.

Instants inside the core are float seconds since the Unix epoch (UTC).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

try:  # compiled: Cython's decorators (see _nocython)
    import cython
except ImportError:  # run as source without Cython
    from wakeline.core import _nocython as cython

import orjson

from wakeline.catalog._values import MISSING, Mismatch, compile_test, parse_datetime
from wakeline.core.jsontext import floats_differ


@dataclass(init=False)  # __init__ below: see plan.pxd
@cython.no_gc
@cython.cclass
class Rec:
    """The fields of a record the core reads (a row of ``records``)."""

    __slots__ = ("seq", "collection", "version", "type", "status", "key", "content", "text",
                 "tombstone", "annotations", "scores", "enriched_at", "created_at",
                 "parents")

    seq: int
    collection: str
    version: int
    type: str
    status: str
    key: str | None
    content: Mapping[str, Any]
    text: str
    tombstone: bool
    annotations: Mapping[str, Any]
    scores: Mapping[str, Any]
    enriched_at: float | None
    created_at: float
    parents: tuple[int, ...]

    def __init__(self, seq: int, collection: str, version: int = 1, type: str = "",
                 status: str = "active", key: str | None = None,
                 content: Mapping[str, Any] | None = None, text: str = "",
                 tombstone: bool = False, annotations: Mapping[str, Any] | None = None,
                 scores: Mapping[str, Any] | None = None, enriched_at: float | None = None,
                 created_at: float = 0.0, parents: tuple[int, ...] = ()) -> None:
        self.seq = seq
        self.collection = collection
        self.version = version
        self.type = type
        self.status = status
        self.key = key
        self.content = {} if content is None else content
        self.text = text
        self.tombstone = tombstone
        self.annotations = {} if annotations is None else annotations
        self.scores = {} if scores is None else scores
        self.enriched_at = enriched_at
        self.created_at = created_at
        self.parents = parents

    @property
    def ready(self) -> bool:
        return self.enriched_at is not None


#: what ``json.dumps(..., sort_keys=True, separators=(",", ":"), default=str)`` builds
#: per call, built once: the same bytes
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


#: orjson, sorted, and leaving to ``_CANONICAL`` every str/int/dict/list subclass,
#: dataclass and datetime (``default=str`` writes those its own way)
_SORTED = (orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS
           | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME)


def canonical(value: Any) -> bytes:
    """``_CANONICAL``'s text of ``value`` as ASCII bytes: the identity every stored
    digest was computed from.  Written by orjson (~0.3 against ~2.5 us for a record's
    content) when its text is the encoder's (:mod:`wakeline.core.jsontext`): no
    ``null`` (orjson's NaN), only printable ASCII, no float below 1e-4."""
    try:
        data = orjson.dumps(value, option=_SORTED)
    except TypeError:  # big integers, non-string keys, other types: default=str
        return _CANONICAL.encode(value).encode()
    if not data.isascii() or b"\x7f" in data or b"null" in data or floats_differ(data):
        return _CANONICAL.encode(value).encode()
    return data


def digest(rec: Rec) -> str:
    """Identity of a keyed value: canonical JSON of content and text."""
    return hashlib.blake2b(canonical([rec.content, rec.text]), digest_size=8).hexdigest()


def _derived() -> Any:
    """A value a frozen plan class computes from its fields in ``__post_init__``.

    Set on every instance at construction (not cached on first use): an attribute
    added to some instances later splits CPython's shared instance layout, and every
    attribute read of the class gets slower (measured: +1.6k instructions per record
    for one such attribute on CondPlan)."""
    return field(init=False, repr=False, compare=False)


def _set(obj: Any, **values: Any) -> None:
    for name, value in values.items():
        object.__setattr__(obj, name, value)


def walk(node: Any, parts: tuple[str, ...] | list[str]) -> Any:
    """The value at ``parts`` inside nested mappings; MISSING when any step is absent."""
    for part in parts:
        # a JSON object is a dict: skip the ABC check for it
        if (type(node) is not dict and not isinstance(node, Mapping)) or part not in node:
            return MISSING
        node = node[part]
    return node


def dig(document: Any, path: str) -> Any:
    return walk(document, path.split(".") if path else ())


@dataclass(frozen=True)
class FieldRef:
    """Where a declared field's value lives, per collection version.

    ``bindings`` maps (collection, version) to (annotator or None, dotted path).
    """

    name: str
    type: str
    items: str | None = None
    bindings: Mapping[tuple[str, int], tuple[str | None, str]] = field(default_factory=dict)

    #: ``bindings`` with each dotted path split once
    _paths: dict[tuple[str, int], tuple[str | None, tuple[str, ...]]] = _derived()

    def __post_init__(self) -> None:
        _set(self, _paths={k: (a, tuple(p.split(".")) if p else ())
                           for k, (a, p) in self.bindings.items()})

    def get(self, rec: Rec) -> Any:
        binding = self._paths.get((rec.collection, rec.version))
        if binding is None:
            return MISSING
        annotator, parts = binding
        return walk(rec.annotations.get(annotator, MISSING) if annotator is not None
                    else rec.content, parts)

    def __hash__(self) -> int:
        return hash((self.name, self.type, self.items, tuple(sorted(self.bindings.items(),
                                                                     key=repr))))


@dataclass(frozen=True)
class Pred:
    field: FieldRef
    op: str
    operand: Any

    _test: Callable[[Any], bool] = _derived()

    def __post_init__(self) -> None:
        _set(self, _test=compile_test(self.op, self.field.type, self.field.items, self.operand))

    def test(self, rec: Rec) -> bool:
        return self._test(self.field.get(rec))


@dataclass(frozen=True)
class ScopePlan:
    collections: frozenset[tuple[str, int]]
    types: frozenset[str] | None = None
    statuses: frozenset[str] | None = None
    where: tuple[Pred, ...] = ()

    #: the collection names of the scope (read per evaluation: built once)
    names: frozenset[str] = _derived()

    def __post_init__(self) -> None:
        _set(self, names=frozenset(n for n, _ in self.collections))

    def base_match(self, rec: Rec) -> bool:
        return ((rec.collection, rec.version) in self.collections
                and (self.types is None or rec.type in self.types)
                and (self.statuses is None or rec.status in self.statuses))

    def match(self, rec: Rec) -> bool:
        return self.base_match(rec) and _where(self.where, rec)


@dataclass(frozen=True)
class MetricPlan:
    """``count``; ``scorer`` name; or ``annotation`` + ``path``; with an aggregate."""

    kind: str  # "count" | "scorer" | "annotation"
    aggregate: str = "sum"
    name: str = ""
    path: str = ""

    def value(self, rec: Rec) -> Any:
        if self.kind == "count":
            return 1
        if self.kind == "scorer":
            v = rec.scores.get(self.name, MISSING)
        else:
            v = dig(rec.annotations.get(self.name, MISSING), self.path)
        if v is MISSING or v is None:
            return None
        if self.aggregate == "distinct_count" or (
                self.aggregate == "count" and self.kind == "annotation"):
            # An annotation leaf is present for count/distinct_count when it holds any
            # JSON scalar (so counting a string leaf counts the rows that carry it).
            return distinct_token(v, numbers_only=self.kind == "scorer")
        t = type(v)
        if t is int or t is float:  # the common JSON numbers, without the ABC checks
            return float(v)
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        return float(v)


def distinct_token(v: Any, *, numbers_only: bool) -> str | None:
    """A value's identity for distinct_count: typed, so true != 1, and 1 == 1.0.

    Scores count only numbers; annotation leaves any JSON scalar (not arrays or
    objects).  None when the value is not present.
    """
    if isinstance(v, bool):
        return None if numbers_only else f"b:{v}"
    if isinstance(v, int | float):
        return f"n:{float(v)!r}"
    if isinstance(v, str) and not numbers_only:
        return f"s:{v}"
    return None


DATA_KINDS = frozenset({"write", "changed", "retraction", "accumulator", "census", "lifecycle"})
REASONS = {"write": "write", "changed": "changed", "retraction": "retraction",
           "accumulator": "threshold", "census": "census", "lifecycle": "lifecycle",
           "quiet": "quiet", "at": "at", "cron": "cron", "read": "read"}


@dataclass(frozen=True)
class CondPlan:
    cid: int
    kind: str
    trigger: str
    derivation: str
    scope: ScopePlan | None = None
    keys: frozenset[str] | None = None
    transitions: frozenset[str] = frozenset({"added", "changed", "removed"})
    metric: MetricPlan | None = None
    threshold: float = 0.0
    comparison: str = "gte"
    window: tuple[float, float] | None = None  # (size_s, hop_s)
    after_s: float = 0.0
    max_wait_s: float | None = None
    at_field: FieldRef | None = None
    offset_s: float = 0.0
    cron_expr: str = ""
    cron_entities: str = "dirty"
    first_record: bool = False
    total_records: int | None = None

    #: the mailbox reason key (read per evaluation: built once)
    reason: str = _derived()
    #: the threshold as outcome reasons print it (``:g``), formatted once
    threshold_text: str = _derived()

    def __post_init__(self) -> None:
        _set(self, reason=f"trigger:{self.trigger}:{REASONS.get(self.kind, self.kind)}",
             threshold_text=f"{self.threshold:g}")

    def deadline(self, rec: Rec) -> float | None:
        assert self.at_field is not None
        raw = self.at_field.get(rec)
        if raw is MISSING or raw is None:
            return None
        try:
            when = parse_datetime(raw, require_tz=True)
        except Mismatch:
            return None
        return when.timestamp() + self.offset_s


@dataclass(frozen=True)
class TriggerPlan:
    name: str
    derivation: str
    hash: str
    conds: tuple[CondPlan, ...]
    cooldown_s: float | None = None
    debounce_s: float | None = None
    max_wait_s: float | None = None


@dataclass(frozen=True)
class DerivationPlan:
    name: str
    index: int
    source: ScopePlan
    mode: str
    allow_empty: bool
    triggers: tuple[TriggerPlan, ...]
    hash: str = ""
    function: str = ""
    timeout_s: float = 300.0
    emits: tuple[str, ...] = ()

    @property
    def read_trigger(self) -> TriggerPlan | None:
        for t in self.triggers:
            if any(c.kind == "read" for c in t.conds):
                return t
        return None


@dataclass
@cython.no_gc
@cython.cclass
class Fact:
    """What the core remembers of one record: matches and values, not content."""

    __slots__ = ("seq", "coll", "key", "tomb", "active", "digest", "ready", "arrived",
                 "created", "drive", "cond")

    seq: int
    coll: str
    key: str | None
    tomb: bool
    active: bool
    digest: str
    ready: bool
    arrived: float | None
    created: float
    drive: tuple[int, ...]
    cond: dict[int, Any]

    def to_list(self) -> list[Any]:
        return [self.seq, self.coll, self.key, self.tomb, self.active, self.digest, self.ready,
                self.arrived, self.created, list(self.drive),
                [[k, v] for k, v in self.cond.items()]]

    @classmethod
    def from_list(cls, data: list[Any]) -> Fact:
        return cls(data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7],
                   data[8], tuple(data[9]), {int(k): v for k, v in data[10]})


_SLOT_KINDS = frozenset({"census", "at", "changed", "retraction"})


def in_scope(fact: Fact, cid: int) -> bool:
    """Is the record of ``fact`` in condition ``cid``'s scope?  (A changed/retraction
    entry of False marks a row that only matches the scope's ``where``.)"""
    return fact.cond.get(cid, False) is not False


class Plan:
    """The compiled evaluation plan of one catalog."""

    def __init__(self, derivations: list[DerivationPlan], keyed: frozenset[str],
                 catalog_hash: str = "") -> None:
        self.derivations = {d.name: d for d in derivations}
        self.by_index = derivations
        self.triggers = {t.name: t for d in derivations for t in d.triggers}
        self.conds = [c for d in derivations for t in d.triggers for c in t.conds]
        self.keyed = keyed
        self.catalog_hash = catalog_hash
        self._scoped = [c for c in self.conds if c.scope is not None]
        self._accumulators = [(c, self.derivations[c.derivation].index)
                              for c in self.conds if c.kind == "accumulator"]
        self._shapes: dict[tuple[str, int, str, str],
                           tuple[tuple[int, ...], frozenset[int], list[CondPlan]]] = {}
        self.conds_by_cid = {c.cid: c for c in self.conds}
        #: per scoped condition, the keyed collections of its scope (slot heads)
        self.keyed_names_of_cid = {c.cid: c.scope.names & keyed  # type: ignore[union-attr]
                                   for c in self._scoped}
        self.derivation_index_of_cid = {c.cid: self.derivations[c.derivation].index
                                        for c in self.conds}
        # Per collection, the derivations whose changed/retraction conditions read
        # its slot transitions (their watermarks bound how far a chain is kept).
        readers: dict[str, list[str]] = {}
        for c in self._scoped:
            if c.kind in ("changed", "retraction"):
                for name in c.scope.names:  # type: ignore[union-attr]
                    readers.setdefault(name, []).append(c.derivation)
        self.transition_readers = {k: tuple(v) for k, v in readers.items()}
        # The collections any condition or driving source reads: a record of
        # another collection is irrelevant to the core.
        self.relevant = frozenset(
            {name for d in derivations for name, _ in d.source.collections}
            | {name for c in self._scoped for name, _ in c.scope.collections}  # type: ignore[union-attr]
        )
        # Keyed collections whose slot heads a condition reads (census, at, changed,
        # retraction): every ready active row of them is remembered, in scope or not,
        # because the head is the slot's last row *before* the scope is applied
        # (docs/semantics.md, Terms) — a newer version that leaves the scope, or
        # carries no deadline, supersedes the old one.
        self.slot_collections = frozenset(
            name for c in self._scoped if c.kind in _SLOT_KINDS
            for name, _ in c.scope.collections if name in keyed)  # type: ignore[union-attr]

    def _shape(self, rec: Rec) -> tuple[tuple[int, ...], frozenset[int], list[CondPlan]]:
        """What a record's collection, version, type and status alone decide: the
        derivations it drives, the conditions whose scope it is in before ``where``,
        and the scoped conditions that can take an entry for it at all (their
        scope names its collection).  Cached per shape (few per catalog)."""
        k = (rec.collection, rec.version, rec.type, rec.status)
        got = self._shapes.get(k)
        if got is None:
            if len(self._shapes) >= 4096:  # arbitrary record types: stay bounded
                self._shapes.clear()
            drive = tuple(d.index for d in self.by_index if d.source.base_match(rec))
            base = frozenset(c.cid for c in self._scoped
                             if c.scope is not None and c.scope.base_match(rec))
            named = [c for c in self._scoped if c.scope is not None
                     and any(n == rec.collection for n, _ in c.scope.collections)]
            got = self._shapes[k] = (drive, base, named)
        return got

    def featurize(self, rec: Rec) -> Fact | None:
        if rec.collection not in self.relevant:
            return None
        drive, base, named = self._shape(rec)
        cond: dict[int, Any] = {}
        # Conditions whose scope does not name the record's collection take no entry
        # (base_match needs the collection; so does a changed/retraction entry).
        for c in named:
            scope = c.scope
            assert scope is not None
            if rec.tombstone and c.kind in ("changed", "retraction", "census", "at"):
                # For transitions `where` is checked on the retracted head; census and
                # `at` never count a tombstone as a current record (docs/semantics.md).
                if c.cid in base:
                    cond[c.cid] = True
                continue
            if c.kind in ("changed", "retraction"):
                # A live row's entry: True when it is in scope; False when only its
                # `where` holds — a later tombstone in scope may still retract it
                # (`where` is evaluated on the retracted head, the rest on r).
                if _where(scope.where, rec):
                    cond[c.cid] = c.cid in base
                continue
            if c.cid not in base or not _where(scope.where, rec):
                continue
            if c.kind == "at":
                d = c.deadline(rec)
                if d is not None:
                    cond[c.cid] = d
            else:
                cond[c.cid] = True
        for c, d_index in self._accumulators:
            if d_index in drive:
                assert c.metric is not None
                cond[c.cid] = c.metric.value(rec)
        keyed = rec.collection in self.keyed
        if not drive and not cond and not (
                rec.collection in self.slot_collections and rec.status == "active"):
            return None
        # Only keyed heads are compared by content; event rows need no digest.
        return Fact(rec.seq, rec.collection, rec.key if keyed else None,
                    rec.tombstone, rec.status == "active", digest(rec) if keyed else "", rec.ready,
                    rec.enriched_at, rec.created_at, drive, cond)


def _where(preds: tuple[Pred, ...], rec: Rec) -> bool:
    for p in preds:  # a loop: all() over a generator costs a frame per record
        if not p._test(p.field.get(rec)):  # p.test(rec) without its frame
            return False
    return True


def to_epoch(value: datetime | float | None) -> float | None:
    if value is None or isinstance(value, float | int):
        return value
    return value.timestamp()


__all__ = ["CondPlan", "DerivationPlan", "Fact", "FieldRef", "MetricPlan", "Plan", "Pred", "Rec",
           "ScopePlan", "TriggerPlan", "digest", "in_scope", "to_epoch"]
