"""The YAML document models of a catalog: collections, derivations, triggers.

These models check *shape* only (keys, types; ``extra="forbid"``, ``frozen=True``,
``strict=True`` so ``"900"`` is not silently a number).  Every cross-reference and
seed rule — scopes, where predicates, thresholds, durations, cycles — is checked by
:mod:`wakeline.catalog.compile`, which reports them with stable codes.

Layout on disk::

    collections/<name>.yaml   one CollectionDoc
    derivations/<name>.yaml   one DerivationDoc, optionally with an inline ``trigger:``
    triggers/<name>.yaml      one TriggerDoc (``name`` + ``processor`` + conditions)
    <package>/...py           derivation callables, imported with the catalog dir on sys.path
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

ScalarType = Literal["string", "number", "integer", "boolean", "datetime"]
FieldTypeName = Literal["string", "number", "integer", "boolean", "datetime", "array", "object"]
Aggregate = Literal["sum", "count", "avg", "max", "min", "distinct_count"]
Transition = Literal["added", "changed", "removed"]
SourceMode = Literal["changes", "snapshot", "current", "view"]

#: Condition keys of a trigger body, in the canonical (normalized) order.
CONDITION_KINDS: tuple[str, ...] = (
    "write",
    "changed",
    "retraction",
    "accumulator",
    "census",
    "lifecycle",
    "quiet",
    "at",
    "cron",
    "read",
)


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _str_or_mapping(value: Any) -> str:
    return "name" if isinstance(value, str) else "spec"


# -- collections ---------------------------------------------------------------


class TypeSpec(Doc):
    """A leaf/field type: a scalar, an array of scalars, or an (unfilterable) object."""

    type: FieldTypeName
    items: ScalarType | None = None


LeafSpec = Annotated[
    Annotated[FieldTypeName, Tag("name")] | Annotated[TypeSpec, Tag("spec")],
    Discriminator(_str_or_mapping),
]


class FieldSpec(Doc):
    """A declared field.

    Backed by ``content`` (a dotted path into the record content; default: the field
    name) or by an annotation (``annotation: <annotator>``, ``path: <dotted leaf>``).
    ``type`` may be omitted for annotation-backed fields: the leaf's type is used.
    """

    type: FieldTypeName | None = None
    items: ScalarType | None = None
    content: str | None = None
    annotation: str | None = None
    path: str | None = None
    filterable: bool | None = None
    description: str | None = None


FieldDecl = Annotated[
    Annotated[FieldTypeName, Tag("name")] | Annotated[FieldSpec, Tag("spec")],
    Discriminator(_str_or_mapping),
]


class AnnotatorSpec(Doc):
    """An annotator (an enrichment processor) and the leaves of its annotation."""

    name: str
    required: bool = True
    leaves: dict[str, LeafSpec] = Field(default_factory=dict)
    description: str | None = None


class VersionSpec(Doc):
    version: int
    fields: dict[str, FieldDecl] = Field(default_factory=dict)
    consumable: bool = True
    description: str | None = None


class CollectionDoc(Doc):
    """``collections/<name>.yaml``."""

    name: str
    keyed: bool = False
    versions: list[VersionSpec] | None = None
    #: Shorthand for a single ``version: 1`` (mutually exclusive with ``versions``).
    fields: dict[str, FieldDecl] | None = None
    active_version: int | None = None
    types: list[str] | None = None
    keys: list[str] | None = None
    scorers: list[str] = Field(default_factory=list)
    annotators: list[AnnotatorSpec] = Field(default_factory=list)
    #: scorer or annotator name → "module:function" that computes it from a record
    #: (run by the readiness agent before the record becomes ready).
    enrichers: dict[str, str] = Field(default_factory=dict)
    description: str | None = None


# -- triggers --------------------------------------------------------------------


class PredicateSpec(Doc):
    """The operators of one ``where`` field (several operators are a conjunction).

    Operands are typed against the field's declared type by the compiler, which
    reports a mismatch as ``where.incompatible``.
    """

    exists: bool | None = None
    eq: Any = None
    in_: list[Any] | None = Field(default=None, alias="in")
    gt: Any = None
    gte: Any = None
    lt: Any = None
    lte: Any = None
    contains_any: list[Any] | None = None
    contains_all: list[Any] | None = None


class ScopeSpec(Doc):
    """A record scope.  Omitted parts are inherited from the derivation's driving source."""

    collections: list[str] | None = None
    types: list[str] | None = None
    statuses: list[str] | None = None
    keyed: bool | None = None
    where: dict[str, PredicateSpec] = Field(default_factory=dict)


class WriteSpec(ScopeSpec):
    pass


class ChangedSpec(ScopeSpec):
    keys: list[str] | None = None
    transitions: list[Transition] | None = None


class RetractionSpec(ScopeSpec):
    pass


class WindowSpec(Doc):
    """A sliding window: ``size_s`` long, advancing every ``hop_s`` (default: min(60, size_s))."""

    size_s: int
    hop_s: int | None = None


class MetricSpec(Doc):
    """``{scorer, aggregate}`` or ``{annotation, path, aggregate}``."""

    scorer: str | None = None
    annotation: str | None = None
    path: str | None = None
    aggregate: Aggregate = "sum"


Metric = Annotated[
    Annotated[str, Tag("name")] | Annotated[MetricSpec, Tag("spec")],
    Discriminator(_str_or_mapping),
]


class AccumulatorSpec(Doc):
    metric: Metric
    threshold: float
    comparison: Literal["gte", "lte"] = "gte"
    window: WindowSpec | None = None


class CensusSpec(ScopeSpec):
    threshold: int
    window: WindowSpec | None = None


class LifecycleSpec(Doc):
    first_record: bool = False
    total_records: int | None = None


class QuietSpec(ScopeSpec):
    after_s: int
    max_wait_s: int | None = None


class AtSpec(ScopeSpec):
    field: str
    offset_s: int = 0


class CronSpec(Doc):
    expr: str
    entities: Literal["dirty", "any"] = "dirty"


class TriggerBody(Doc):
    """Conditions + pacing: the inline ``trigger:`` block, or the body of a trigger file."""

    write: WriteSpec | None = None
    changed: ChangedSpec | None = None
    retraction: RetractionSpec | None = None
    accumulator: AccumulatorSpec | None = None
    census: CensusSpec | None = None
    lifecycle: LifecycleSpec | None = None
    quiet: QuietSpec | None = None
    at: AtSpec | None = None
    cron: CronSpec | None = None
    read: bool | None = None
    cooldown_s: int | None = None
    debounce_s: int | None = None
    #: With debounce_s: a burst that never settles still runs after max_wait_s.
    max_wait_s: int | None = None
    description: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_conditions(cls, data: Any) -> Any:
        """A bare ``write:`` (YAML null) enables the condition with its defaults.

        Without this, ``write:`` would parse as ``None`` and silently disable it.
        """
        if isinstance(data, dict):
            return {
                k: ({} if v is None and k in _MAPPING_CONDITIONS else v) for k, v in data.items()
            }
        return data


_MAPPING_CONDITIONS = frozenset(CONDITION_KINDS) - {"read"}


class TriggerDoc(TriggerBody):
    """``triggers/<name>.yaml``: a named trigger attached to an existing derivation."""

    name: str
    processor: str | None = None
    derivation: str | None = None
    #: The older word for a derivation.
    pipeline: str | None = None


# -- derivations -----------------------------------------------------------------


class SourceSpec(Doc):
    """The driving source: what the derivation reads and its cursor consumes."""

    collections: list[str]
    types: list[str] | None = None
    statuses: list[str] | None = None
    mode: SourceMode = "changes"
    allow_empty: bool = False


class DerivationDoc(Doc):
    """``derivations/<name>.yaml``."""

    name: str
    source: SourceSpec
    function: str
    emits: list[str] = Field(default_factory=list)
    timeout_s: int = 300
    trigger: TriggerBody | None = None
    description: str | None = None


DOCUMENT_KINDS: dict[str, type[Doc]] = {
    "collection": CollectionDoc,
    "derivation": DerivationDoc,
    "trigger": TriggerDoc,
}

#: Which catalog sub-directory holds which document kind.
DIRECTORIES: dict[str, str] = {
    "collections": "collection",
    "derivations": "derivation",
    "triggers": "trigger",
}
