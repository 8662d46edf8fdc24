"""Catalog errors and the stable issue codes of catalog compilation.

Hierarchy (under :class:`wakeline.errors.ConfigError`)::

    CatalogError            "catalog"            any catalog problem
    ├── CatalogNotFound     "catalog.not_found"  the catalog directory does not exist
    ├── CatalogInvalid      "catalog.invalid"    compilation found issues (``.issues``)
    ├── FunctionUnresolved  "catalog.function"   a derivation callable cannot be imported
    └── InvalidEmission     "catalog.emission"   a derivation returned a malformed emission

Compilation never stops at the first problem: every rule violation in every file
becomes one :class:`CatalogIssue` ``(code, file, path, message, line)`` and they are
raised together as one :class:`CatalogInvalid`.  ``path`` is the YAML path inside
``file`` (``trigger.accumulator.metric``, ``versions[1].fields.tags``); ``message``
says what is wrong *and how to fix it*.

Issue codes (stable; tests and tooling match on them)::

    YAML and document shape
      yaml.unreadable            file cannot be read or is not valid YAML (line number given)
      yaml.on_trap               a boolean mapping key (unquoted on/off/yes/no) — write
                                 ``transitions:`` or quote the key
      yaml.duplicate_key         a mapping repeats a key (PyYAML would keep the last silently)
      schema.not_mapping         the document is not a YAML mapping
      schema.unknown_key         a key the document kind does not accept (extra="forbid")
      schema.missing             a required key is absent
      schema.invalid             a value has the wrong type or shape
      catalog.empty              no collections/, derivations/ or triggers/ YAML files

    Names and references
      name.invalid               a name does not match ``^[a-z][a-z0-9._-]{0,63}$`` (fields:
                                 ``^[A-Za-z_][A-Za-z0-9_]*$``)
      name.duplicate             two collections, derivations or triggers share a name
      collection.unknown         a reference to a collection no file declares
      collection.unknown_version a ``name@version`` reference to a version that is not declared
      collection.version_duplicate  one collection declares a version number twice
      collection.not_consumable  a driving source reads a version declared ``consumable: false``
      collection.versions_and_fields  both ``versions:`` and top-level ``fields:`` given
      field.invalid              a field declaration is inconsistent (items on a scalar, an
                                 array without items, a filterable object, ...)
      field.unknown_annotator    a field is backed by an annotator the collection does not declare
      field.unknown_leaf         a field names an annotation leaf the annotator does not declare
      field.annotation_mismatch  a field's declared type differs from its annotation leaf's type
      function.invalid           ``function`` is not ``module:function``
      enricher.unknown           an ``enrichers:`` key is neither a scorer nor an annotator
      function.unresolved        (with ``resolve_functions=True``) the callable cannot be imported
      trigger.unknown_derivation a standalone trigger names a derivation no file declares
      trigger.processor          a standalone trigger gives none, or more than one, of
                                 processor / derivation / pipeline

    Trigger rules (seed 000, "Compile-time validation")
      trigger.no_conditions      a declared trigger enables no condition
      cron.invalid               a cron expression that is not a valid 5-field UTC schedule
      scope.not_subset           a consuming scope (write, quiet, changed, retraction) is not a
                                 subset of the derivation's driving source (collections and
                                 versions, types, statuses)
      scope.empty                a scope list (collections, types, statuses) is empty
      scope.unknown_type         a scope names a type no scoped collection declares
      scope.not_keyed            a changed/retraction scope is ``keyed: false`` or names an
                                 event (``keyed: false``) collection
      scope.keyed_mismatch       a scope's ``keyed:`` contradicts a scoped collection
      where.undeclared           a where field is not declared by every scoped collection version
      where.not_filterable       a where field is declared ``filterable: false``
      where.optional_annotation  a where field is backed by an optional (required: false) annotator
      where.incompatible         a where field has different types across scoped versions, or the
                                 operator/operand does not fit its type
      where.empty                a where field with no operator
      at.bad_field               the ``at`` field is not a filterable datetime scalar (content- or
                                 required-annotation-backed) declared by every scoped version
      accumulator.unknown_scorer      the metric names a scorer no driving collection declares
      accumulator.unknown_annotation  the metric names an unknown annotator or leaf
      accumulator.optional_annotation the metric's annotator is optional (required: false)
      accumulator.non_numeric    a non-numeric leaf under sum/avg/max/min
      accumulator.scorer_and_annotation  the metric names both a scorer and an annotation
      accumulator.metric         the metric mapping is incomplete (annotation without path, ...)
      accumulator.threshold      a gte threshold that is not positive, or a non-finite threshold
      census.threshold           a census threshold below 1
      lifecycle.empty            a lifecycle block with neither first_record nor total_records
      lifecycle.total_records    total_records below 1
      changed.transitions        empty transitions list
      changed.unknown_key        changed.keys names a key a keyed collection does not declare
      duration.range             after_s, debounce_s, cooldown_s, max_wait_s, timeout_s or a
                                 window size outside 1 s – 7 d (offset_s outside ±366 d)
      pacing.max_wait            max_wait_s without its settle window, or shorter than it
      pacing.debounce_inapplicable  debounce_s on a trigger with no data condition
      window.invalid             a window whose hop_s exceeds size_s
      graph.cycle                trigger → derivation → emission chain feeds itself

Warnings (``Catalog.warnings``; they never fail compilation)::

      at.changes_source          an ``at`` trigger on a ``mode: changes`` source (the run may
                                 not see a dated record consumed long before its deadline)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from wakeline.errors import ConfigError

__all__ = [
    "CatalogError",
    "CatalogInvalid",
    "CatalogIssue",
    "CatalogNotFound",
    "FunctionUnresolved",
    "InvalidEmission",
]


@dataclass(frozen=True, order=True)
class CatalogIssue:
    """One rule violation: where (file, YAML path, line) and how to fix it (message)."""

    file: str
    path: str
    code: str
    message: str
    line: int | None = None

    def format(self) -> str:
        """``file:path: [code] message`` (plus the line when known)."""
        where = f"{self.file}:{self.path}" if self.path else self.file
        line = f" (line {self.line})" if self.line else ""
        return f"{where}: [{self.code}] {self.message}{line}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "file": self.file,
            "path": self.path,
            "line": self.line,
            "message": self.message,
        }


class CatalogError(ConfigError):
    """Any problem with a catalog."""

    code = "catalog"


class CatalogNotFound(CatalogError):
    code = "catalog.not_found"


class CatalogInvalid(CatalogError):
    """Compilation found one or more issues; ``issues`` holds every one of them."""

    code = "catalog.invalid"

    def __init__(self, issues: Iterable[CatalogIssue], *, root: str = "") -> None:
        self.issues: tuple[CatalogIssue, ...] = tuple(sorted(issues))
        lines = "\n".join("  " + issue.format() for issue in self.issues)
        n = len(self.issues)
        super().__init__(
            f"catalog {root or '.'} is invalid ({n} issue{'s' if n != 1 else ''}); "
            f"fix each of them and re-run `wakeline catalog check`:\n{lines}",
            root=root,
        )

    @property
    def codes(self) -> list[str]:
        return [issue.code for issue in self.issues]

    def by_code(self, code: str) -> Sequence[CatalogIssue]:
        return [issue for issue in self.issues if issue.code == code]


class FunctionUnresolved(CatalogError):
    code = "catalog.function"


class InvalidEmission(CatalogError):
    code = "catalog.emission"
