"""Compile collection documents: versions, declared fields and their backing,
scorers, and annotators with their leaf types."""

from __future__ import annotations

from wakeline.catalog._common import (
    DOTTED_RE,
    FIELD_RE,
    LABEL_RE,
    Collections,
    Reporter,
    check_name,
    dedupe_sorted,
)
from wakeline.catalog._yaml import join
from wakeline.catalog.normalized import (
    AnnotatorDef,
    Collection,
    CollectionVersion,
    FieldDef,
    LeafType,
    semantic_hash,
)
from wakeline.catalog.schema import CollectionDoc, FieldSpec, FieldTypeName, TypeSpec, VersionSpec


class CollectionCompiler:
    def __init__(self, rep: Reporter, colls: Collections) -> None:
        self.rep = rep
        self.colls = colls

    def compile(self, f: str, m: CollectionDoc) -> None:
        """Add the compiled collection to ``colls`` (or mark its name broken)."""
        before = self.rep.count()
        if not check_name(self.rep, f, "name", m.name, "collection"):
            self.colls.broken.add(m.name)
            return
        if m.name in self.colls.by_name or m.name in self.colls.broken:
            other = self.colls.by_name[m.name].file if m.name in self.colls.by_name else "?"
            self.rep.add(
                "name.duplicate", f, "name",
                f"collection {m.name!r} is also defined in {other}; rename one of them",
            )
            return
        annotators = self._annotators(f, m)
        if m.versions is not None and m.fields is not None:
            self.rep.add(
                "collection.versions_and_fields", f, "fields",
                "give either `versions:` (a list) or top-level `fields:` (shorthand for a "
                "single version 1), not both; move these fields into a version",
            )
        specs = m.versions
        if specs is None:
            specs = [VersionSpec(version=1, fields=m.fields or {})]
        if not specs:
            self.rep.add(
                "schema.invalid", f, "versions",
                "`versions: []` declares no version; add `- {version: 1, fields: {...}}`",
            )
        versions: list[CollectionVersion] = []
        seen: set[int] = set()
        for i, spec in enumerate(specs):
            vpath = join("versions", i) if m.versions is not None else ""
            if spec.version < 1:
                self.rep.add(
                    "schema.invalid", f, join(vpath, "version"),
                    f"version {spec.version} must be a positive integer; number versions 1, 2, …",
                )
                continue
            if spec.version in seen:
                self.rep.add(
                    "collection.version_duplicate", f, join(vpath, "version"),
                    f"version {spec.version} is declared twice; give each version its own number",
                )
                continue
            seen.add(spec.version)
            fields = {}
            for fname, decl in spec.fields.items():
                fd = self._field(f, join(join(vpath, "fields"), fname), fname, decl, annotators)
                if fd is not None:
                    fields[fname] = fd
            versions.append(
                CollectionVersion(version=spec.version, consumable=spec.consumable, fields=fields)
            )
        active = m.active_version if m.active_version is not None else max(seen, default=1)
        if m.active_version is not None and m.active_version not in seen:
            self.rep.add(
                "collection.unknown_version", f, "active_version",
                f"active_version {m.active_version} is not a declared version "
                f"({', '.join(map(str, sorted(seen)))}); pick one or omit it for the highest",
            )
        for key in ("types", "keys"):
            for i, label in enumerate(getattr(m, key) or []):
                if not LABEL_RE.match(label):
                    self.rep.add(
                        "name.invalid", f, join(key, i),
                        f"{key[:-1]} {label!r} must be a non-empty word ([A-Za-z0-9_.:-]); fix it",
                    )
        if m.keys is not None and not m.keyed:
            self.rep.add(
                "field.invalid", f, "keys",
                "`keys:` lists the slots of a keyed collection, but this one is keyed: false; "
                "set `keyed: true` or remove `keys:`",
            )
        scorers = self._scorers(f, m)
        self._enrichers(f, m, scorers, annotators)
        if self.rep.count() > before:
            self.colls.broken.add(m.name)
            return
        coll = Collection(
            name=m.name, keyed=m.keyed, active_version=active,
            versions=tuple(sorted(versions, key=lambda v: v.version)),
            types=dedupe_sorted(m.types), keys=dedupe_sorted(m.keys), scorers=scorers,
            annotators=annotators, enrichers=dict(sorted(m.enrichers.items())), file=f,
            description=m.description,
        )
        self.colls.by_name[m.name] = coll.model_copy(update={"hash": semantic_hash(coll)})

    def _enrichers(self, f: str, m: CollectionDoc, scorers: tuple[str, ...],
                   annotators: dict[str, AnnotatorDef]) -> None:
        from wakeline.catalog._functions import FUNCTION_RE

        for name, ref in m.enrichers.items():
            path = join("enrichers", name)
            if name not in scorers and name not in annotators:
                known = ", ".join(sorted({*scorers, *annotators})) or "none"
                self.rep.add("enricher.unknown", f, path,
                             f"{name!r} is neither a scorer nor an annotator of {m.name} "
                             f"(declared: {known}); declare it or fix the name")
            if not FUNCTION_RE.match(ref):
                self.rep.add("function.invalid", f, path,
                             f"enricher {ref!r} is not 'module:function'; write e.g. "
                             "'agent_memory.enrich:importance'")

    def _scorers(self, f: str, m: CollectionDoc) -> tuple[str, ...]:
        for i, s in enumerate(m.scorers):
            if check_name(self.rep, f, join("scorers", i), s, "scorer") and m.scorers.index(s) != i:
                self.rep.add("name.duplicate", f, join("scorers", i),
                             f"scorer {s!r} is listed twice; remove the repeat")
        return tuple(sorted(set(m.scorers)))

    def _annotators(self, f: str, m: CollectionDoc) -> dict[str, AnnotatorDef]:
        out: dict[str, AnnotatorDef] = {}
        for i, a in enumerate(m.annotators):
            apath = join("annotators", i)
            if not check_name(self.rep, f, join(apath, "name"), a.name, "annotator"):
                continue
            if a.name in out:
                self.rep.add("name.duplicate", f, join(apath, "name"),
                             f"annotator {a.name!r} is declared twice; keep one declaration")
                continue
            leaves = {}
            for leaf, spec in a.leaves.items():
                lpath = join(join(apath, "leaves"), leaf)
                if not DOTTED_RE.match(leaf):
                    self.rep.add("name.invalid", f, lpath,
                                 f"leaf path {leaf!r} must be dotted identifiers (a.b.c); fix it")
                    continue
                t = TypeSpec(type=spec) if isinstance(spec, str) else spec
                if self._type_ok(f, lpath, t.type, t.items):
                    leaves[leaf] = LeafType(type=t.type, items=t.items)
            out[a.name] = AnnotatorDef(name=a.name, required=a.required, leaves=leaves)
        return out

    def _type_ok(self, f: str, path: str, type_: str, items: str | None) -> bool:
        if type_ == "array" and items is None:
            self.rep.add("field.invalid", f, path,
                         "an array needs `items:` (string, number, integer, boolean or "
                         "datetime); write {type: array, items: string}")
            return False
        if type_ != "array" and items is not None:
            self.rep.add("field.invalid", f, join(path, "items"),
                         f"`items:` only applies to arrays, and this is a {type_}; remove it "
                         "or set `type: array`")
            return False
        return True

    def _field(
        self, f: str, path: str, name: str, decl: FieldTypeName | FieldSpec,
        annotators: dict[str, AnnotatorDef],
    ) -> FieldDef | None:
        if not FIELD_RE.match(name):
            self.rep.add("name.invalid", f, path,
                         f"field name {name!r} must match ^[A-Za-z_][A-Za-z0-9_]*$; rename it "
                         "(use `content: a.b` for a nested content path)")
            return None
        spec = FieldSpec(type=decl) if isinstance(decl, str) else decl
        type_, items = spec.type, spec.items
        required = True
        if spec.annotation is not None:
            if spec.content is not None:
                self.rep.add("field.invalid", f, join(path, "content"),
                             "a field is backed by content or by an annotation, not both; "
                             "remove `content:` or `annotation:`")
                return None
            if spec.path is None:
                self.rep.add("field.invalid", f, path,
                             f"annotation-backed field {name!r} needs `path:` (the leaf inside "
                             f"{spec.annotation!r}); add it")
                return None
            ann = annotators.get(spec.annotation)
            if ann is None:
                self.rep.add("field.unknown_annotator", f, join(path, "annotation"),
                             f"annotator {spec.annotation!r} is not declared by this collection "
                             f"(annotators: {', '.join(sorted(annotators)) or 'none'}); declare "
                             "it under `annotators:` or fix the name")
                return None
            leaf = ann.leaves.get(spec.path)
            if leaf is None:
                self.rep.add("field.unknown_leaf", f, join(path, "path"),
                             f"annotator {ann.name!r} declares no leaf {spec.path!r} (leaves: "
                             f"{', '.join(sorted(ann.leaves)) or 'none'}); add it to the "
                             "annotator's `leaves:` or fix the path")
                return None
            if type_ is None:
                type_, items = leaf.type, leaf.items
            elif (type_, items) != (leaf.type, leaf.items) and not (
                {type_, leaf.type} <= {"number", "integer"}
            ):
                self.rep.add("field.annotation_mismatch", f, join(path, "type"),
                             f"field {name!r} says {type_} but leaf {ann.name}.{spec.path} is "
                             f"{leaf.type}; make them agree (or omit `type:` to use the leaf's)")
                return None
            required = ann.required
            backing, dotted, annotator = "annotation", spec.path, ann.name
        else:
            if spec.path is not None:
                self.rep.add("field.invalid", f, join(path, "path"),
                             "`path:` is the leaf of an annotation; for a nested content value "
                             "write `content: a.b` instead")
                return None
            if type_ is None:
                self.rep.add("field.invalid", f, path,
                             f"field {name!r} needs `type:` (string, number, integer, boolean, "
                             "datetime, array, object); add it")
                return None
            backing, dotted, annotator = "content", spec.content or name, None
            if not DOTTED_RE.match(dotted):
                self.rep.add("field.invalid", f, join(path, "content"),
                             f"content path {dotted!r} must be dotted identifiers (a.b.c); fix it")
                return None
        if not self._type_ok(f, path, type_, items):
            return None
        filterable = spec.filterable if spec.filterable is not None else type_ != "object"
        if type_ == "object" and filterable:
            self.rep.add("field.invalid", f, join(path, "filterable"),
                         "object fields cannot be filterable; declare the scalar leaves you "
                         "want to filter on as their own fields (content: obj.leaf)")
            return None
        return FieldDef(
            name=name, type=type_, items=items, filterable=filterable,
            backing=backing, path=dotted, annotator=annotator,  # type: ignore[arg-type]
            required=required, description=spec.description,
        )

