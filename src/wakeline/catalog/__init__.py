"""The catalog: collections, derivations and triggers, compiled and normalized.

    >>> from wakeline.catalog import compile_catalog
    >>> catalog = compile_catalog("catalog/")                # doctest: +SKIP
    >>> catalog.triggers_for("profile")                      # doctest: +SKIP

Documents are modelled in :mod:`~wakeline.catalog.schema`, compiled by
:mod:`~wakeline.catalog.compile` (issue codes in :mod:`~wakeline.catalog.errors`),
and returned as the frozen models of :mod:`~wakeline.catalog.normalized`.  The
derivation callable contract is in :mod:`~wakeline.catalog.contract`.
"""

from wakeline.catalog.compile import CompileResult, check_catalog, compile_catalog
from wakeline.catalog.contract import DerivationContext, validate_emissions
from wakeline.catalog.errors import (
    CatalogError,
    CatalogInvalid,
    CatalogIssue,
    CatalogNotFound,
    FunctionUnresolved,
    InvalidEmission,
)
from wakeline.catalog.jsonschema import document_schema, document_schemas
from wakeline.catalog.normalized import (
    AccumulatorCondition,
    AtCondition,
    Catalog,
    CensusCondition,
    ChangedCondition,
    Collection,
    CollectionRef,
    CollectionVersion,
    Condition,
    CronCondition,
    Derivation,
    FieldBinding,
    FieldDef,
    FieldRef,
    LifecycleCondition,
    Metric,
    QuietCondition,
    ReadCondition,
    RetractionCondition,
    Scope,
    Source,
    Trigger,
    WherePredicate,
    Window,
    WriteCondition,
    semantic_hash,
)

__all__ = [
    "AccumulatorCondition",
    "AtCondition",
    "Catalog",
    "CatalogError",
    "CatalogInvalid",
    "CatalogIssue",
    "CatalogNotFound",
    "CensusCondition",
    "ChangedCondition",
    "Collection",
    "CollectionRef",
    "CollectionVersion",
    "CompileResult",
    "Condition",
    "CronCondition",
    "Derivation",
    "DerivationContext",
    "FieldBinding",
    "FieldDef",
    "FieldRef",
    "FunctionUnresolved",
    "InvalidEmission",
    "LifecycleCondition",
    "Metric",
    "QuietCondition",
    "ReadCondition",
    "RetractionCondition",
    "Scope",
    "Source",
    "Trigger",
    "WherePredicate",
    "Window",
    "WriteCondition",
    "check_catalog",
    "compile_catalog",
    "document_schema",
    "document_schemas",
    "semantic_hash",
    "validate_emissions",
]
