"""Load a catalog directory and compile it into a normalized :class:`Catalog`.

``compile_catalog(path)`` reads ``collections/``, ``derivations/`` and ``triggers/``
(``*.yaml``/``*.yml``, recursively, in sorted order), validates every document with
the pydantic models of :mod:`wakeline.catalog.schema`, then applies every rule of
seed 000's "Compile-time validation" (see :mod:`wakeline.catalog.errors` for the
codes).  It collects *all* issues and raises one :class:`CatalogInvalid`.

Order: collections → derivations (sources, emits) → triggers (inline ``trigger:`` as
``<derivation>.default``, then standalone files) → the dependency-cycle check →
semantic hashes.  A document that fails its schema is skipped, and references to its
name are not reported again, so one typo yields one issue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from wakeline.catalog._collections import CollectionCompiler
from wakeline.catalog._common import (
    Collections,
    Reporter,
    check_duration,
    check_name,
    dedupe_sorted,
)
from wakeline.catalog._functions import FUNCTION_RE, resolve_callable
from wakeline.catalog._graph import check_cycles
from wakeline.catalog._schema_errors import report_validation_error
from wakeline.catalog._scopes import ScopeCompiler
from wakeline.catalog._triggers import TriggerCompiler
from wakeline.catalog._yaml import LoadedDoc, join, load_yaml
from wakeline.catalog.errors import (
    CatalogInvalid,
    CatalogIssue,
    CatalogNotFound,
    FunctionUnresolved,
)
from wakeline.catalog.normalized import (
    Catalog,
    CollectionRef,
    Derivation,
    Source,
    Trigger,
    semantic_hash,
)
from wakeline.catalog.schema import (
    DIRECTORIES,
    CollectionDoc,
    DerivationDoc,
    TriggerDoc,
)

__all__ = ["CompileResult", "check_catalog", "compile_catalog"]

M = TypeVar("M", bound=BaseModel)


@dataclass
class CompileResult:
    """Everything a compilation produced: the catalog (None if invalid) and all issues."""

    catalog: Catalog | None
    issues: list[CatalogIssue] = field(default_factory=list)
    warnings: list[CatalogIssue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.catalog is not None


def compile_catalog(path: str | Path, *, resolve_functions: bool = False) -> Catalog:
    """Compile the catalog directory at ``path``; raise CatalogInvalid with every issue.

    ``resolve_functions=True`` also imports each derivation's callable (with the
    catalog directory on ``sys.path``) and reports ``function.unresolved``.
    """
    result = check_catalog(path, resolve_functions=resolve_functions)
    if result.catalog is None:
        raise CatalogInvalid(result.issues, root=str(path))
    return result.catalog


def check_catalog(path: str | Path, *, resolve_functions: bool = False) -> CompileResult:
    """Compile without raising for rule violations (CatalogNotFound still raises)."""
    root = Path(path)
    if not root.is_dir():
        raise CatalogNotFound(
            f"catalog directory {str(path)!r} does not exist or is not a directory; pass the "
            "directory that holds collections/, derivations/ and triggers/",
            path=str(path),
        )
    return _Compiler(root.resolve(), resolve_functions).run()


class _Compiler:
    def __init__(self, root: Path, resolve_functions: bool) -> None:
        self.root = root
        self.resolve_functions = resolve_functions
        self.rep = Reporter()
        self.colls = Collections()
        self.collection_compiler = CollectionCompiler(self.rep, self.colls)
        self.derivations: dict[str, Derivation] = {}
        self.broken_derivations: set[str] = set()
        self.triggers: dict[str, Trigger] = {}
        self.trigger_files: dict[str, str] = {}

    def run(self) -> CompileResult:
        docs = self._discover()
        if not any(docs.values()):
            self.rep.add(
                "catalog.empty", ".", "",
                f"no YAML files under {self.root}/collections, derivations or triggers; point "
                "at a catalog directory or add collections/<name>.yaml",
            )
        for doc in docs["collection"]:
            self._collection(doc)
        inline: list[tuple[Derivation, DerivationDoc, str]] = []
        for doc in docs["derivation"]:
            compiled = self._derivation(doc)
            if compiled is not None:
                inline.append((*compiled, doc.file))
        tc = TriggerCompiler(self.rep, self.colls)
        for d, model, file in inline:
            if model.trigger is not None:
                t = tc.compile(
                    name=f"{d.name}.default", derivation=d, body=model.trigger, file=file,
                    base="trigger", origin="inline",
                )
                self._add_trigger(t, f"{d.name}.default", file, "trigger")
        for doc in docs["trigger"]:
            self._standalone(doc, tc)
        # Edges come only from triggers that compiled, so a partial graph can miss a
        # cycle but never invent one: safe to report alongside other issues.
        check_cycles(self.rep, self.derivations, self.triggers)
        if self.rep.issues:
            return CompileResult(None, sorted(self.rep.issues), sorted(self.rep.warnings))
        catalog = Catalog(
            root=str(self.root), collections=dict(sorted(self.colls.by_name.items())),
            derivations=dict(sorted(self.derivations.items())),
            triggers=dict(sorted(self.triggers.items())), warnings=tuple(sorted(self.rep.warnings)),
        )
        catalog = catalog.model_copy(update={"hash": semantic_hash({
            "collections": {n: c.hash for n, c in catalog.collections.items()},
            "derivations": {n: d.hash for n, d in catalog.derivations.items()},
            "triggers": {n: t.hash for n, t in catalog.triggers.items()},
        })})
        return CompileResult(catalog, [], sorted(self.rep.warnings))

    # -- loading --------------------------------------------------------------------------

    def _discover(self) -> dict[str, list[LoadedDoc]]:
        out: dict[str, list[LoadedDoc]] = {kind: [] for kind in DIRECTORIES.values()}
        for dirname, kind in DIRECTORIES.items():
            base = self.root / dirname
            if not base.is_dir():
                continue
            files = sorted(p for p in base.rglob("*") if p.suffix in (".yaml", ".yml")
                           and p.is_file())
            for p in files:
                display = p.relative_to(self.root).as_posix()
                doc = load_yaml(p, display)
                self.rep.docs[display] = doc
                self.rep.issues.extend(doc.issues)
                out[kind].append(doc)
        return out

    def _validate(self, doc: LoadedDoc, model: type[M], what: str) -> M | None:
        if doc.data is None and doc.issues:
            return None
        if not isinstance(doc.data, dict):
            self.rep.add(
                "schema.not_mapping", doc.file, "",
                f"a {what} file holds one YAML mapping (got "
                f"{'an empty file' if doc.data is None else type(doc.data).__name__}); write "
                "`name: ...` and the other keys at the top level",
            )
            return None
        try:
            return model.model_validate(doc.data)
        except ValidationError as exc:
            report_validation_error(self.rep, doc.file, model, doc.data, exc)
            return None

    @staticmethod
    def _raw_name(doc: LoadedDoc) -> str | None:
        name = doc.data.get("name") if isinstance(doc.data, dict) else None
        return name if isinstance(name, str) else None

    # -- collections ------------------------------------------------------------------------

    def _collection(self, doc: LoadedDoc) -> None:
        m = self._validate(doc, CollectionDoc, "collection")
        if m is None:
            if (name := self._raw_name(doc)) is not None:
                self.colls.broken.add(name)
            return
        self.collection_compiler.compile(doc.file, m)

    # -- derivations -----------------------------------------------------------------------

    def _derivation(self, doc: LoadedDoc) -> tuple[Derivation, DerivationDoc] | None:
        m = self._validate(doc, DerivationDoc, "derivation")
        if m is None:
            if (name := self._raw_name(doc)) is not None:
                self.broken_derivations.add(name)
            return None
        f, before = doc.file, self.rep.count()
        if check_name(self.rep, f, "name", m.name, "derivation") and len(m.name) > 56:
            self.rep.add("name.invalid", f, "name",
                         f"derivation name {m.name!r} is {len(m.name)} characters, so its inline "
                         f"trigger {m.name}.default would exceed 64; shorten it to 56 or fewer")
        if m.name in self.derivations or m.name in self.broken_derivations:
            other = self.derivations[m.name].file if m.name in self.derivations else "?"
            self.rep.add("name.duplicate", f, "name",
                         f"derivation {m.name!r} is also defined in {other}; rename one of them")
            return None
        if not FUNCTION_RE.match(m.function):
            self.rep.add("function.invalid", f, "function",
                         f"function {m.function!r} is not 'module:function'; write e.g. "
                         "'agent_memory.profile:derive' (a module under the catalog directory)")
        elif self.resolve_functions:
            try:
                resolve_callable(self.root, m.function)
            except FunctionUnresolved as exc:
                self.rep.add("function.unresolved", f, "function", exc.message)
        src = m.source
        refs: list[CollectionRef] = []
        if not src.collections:
            self.rep.add("scope.empty", f, "source.collections",
                         "a driving source needs at least one collection; list them")
        for i, text in enumerate(src.collections):
            path = join("source.collections", i)
            ref = self.colls.resolve(self.rep, f, path, text)
            if ref is None or ref in refs:
                continue
            if not self.colls.by_name[ref.collection].version(ref.version).consumable:
                self.rep.add("collection.not_consumable", f, path,
                             f"{ref} is declared `consumable: false`, so no driving source may "
                             "read it; read a consumable version (name@<version>) instead")
                continue
            refs.append(ref)
        for part in ("types", "statuses"):
            values = getattr(src, part)
            if values is not None and not values:
                self.rep.add("scope.empty", f, f"source.{part}",
                             f"`{part}: []` matches nothing; list values or omit it for any")
        if src.types:
            ScopeCompiler(self.rep, self.colls).known_types(
                f, "source", refs, dedupe_sorted(src.types)
            )
        emits: list[CollectionRef] = []
        for i, text in enumerate(m.emits):
            ref = self.colls.resolve(self.rep, f, join("emits", i), text)
            if ref is not None and ref not in emits:
                emits.append(ref)
        check_duration(self.rep, f, "timeout_s", m.timeout_s, "timeout_s")
        if self.rep.count() > before:
            self.broken_derivations.add(m.name)
            return None
        d = Derivation(
            name=m.name,
            source=Source(
                collections=tuple(sorted(refs, key=lambda r: (r.collection, r.version))),
                types=dedupe_sorted(src.types), statuses=dedupe_sorted(src.statuses),
                mode=src.mode, allow_empty=src.allow_empty,
            ),
            function=m.function,
            emits=tuple(sorted(emits, key=lambda r: (r.collection, r.version))),
            timeout_s=m.timeout_s, file=f, description=m.description,
        )
        d = d.model_copy(update={"hash": semantic_hash(d)})
        self.derivations[d.name] = d
        return d, m

    # -- triggers --------------------------------------------------------------------------

    def _standalone(self, doc: LoadedDoc, tc: TriggerCompiler) -> None:
        m = self._validate(doc, TriggerDoc, "trigger")
        if m is None:
            return
        f = doc.file
        if not check_name(self.rep, f, "name", m.name, "trigger"):
            return
        given = [(k, v) for k in ("processor", "derivation", "pipeline")
                 if (v := getattr(m, k)) is not None]
        if len(given) != 1:
            self.rep.add(
                "trigger.processor", f, given[1][0] if given else "",
                "a standalone trigger names exactly one target: write `processor: "
                "<derivation name>`" + (" (remove the other alias)" if given else ""),
            )
            return
        key, target = given[0]
        d = self.derivations.get(target)
        if d is None:
            if target not in self.broken_derivations:
                known = ", ".join(sorted(self.derivations)) or "none"
                self.rep.add(
                    "trigger.unknown_derivation", f, key,
                    f"trigger {m.name!r} names unknown derivation {target!r} (declared: "
                    f"{known}); fix the name or add derivations/{target}.yaml",
                )
            return
        t = tc.compile(name=m.name, derivation=d, body=m, file=f, base="", origin="standalone")
        self._add_trigger(t, m.name, f, "name")

    def _add_trigger(self, t: Trigger | None, name: str, file: str, path: str) -> None:
        if name in self.trigger_files:
            self.rep.add(
                "name.duplicate", file, path,
                f"trigger {name!r} is also defined in {self.trigger_files[name]}; trigger names "
                "are unique semantic identities — rename this one",
            )
            return
        self.trigger_files[name] = file
        if t is not None:
            self.triggers[name] = t

