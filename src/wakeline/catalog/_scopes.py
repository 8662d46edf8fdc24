"""Scopes and where predicates: inheritance, the subset rule, typed fields."""

from __future__ import annotations

from typing import Any

from wakeline.catalog import _values
from wakeline.catalog._common import Collections, Reporter, dedupe_sorted
from wakeline.catalog._yaml import join
from wakeline.catalog.normalized import (
    CONSUMING_KINDS,
    CollectionRef,
    Derivation,
    FieldBinding,
    FieldDef,
    FieldRef,
    Scope,
    WherePredicate,
)
from wakeline.catalog.schema import PredicateSpec, ScopeSpec

_OP_ORDER = ("exists", "eq", "in", "gt", "gte", "lt", "lte", "contains_any", "contains_all")
_KEYED_KINDS = frozenset({"changed", "retraction"})


def _type_label(type_: str, items: str | None) -> str:
    return f"array of {items}" if type_ == "array" else type_


def _merge_numeric(types: set[tuple[str, str | None]]) -> set[tuple[str, str | None]]:
    """integer and number are compatible; the merged type is number."""
    out = set()
    for t, items in types:
        t = "number" if t == "integer" and ("number", items) in types else t
        if t == "array" and items == "integer" and ("array", "number") in types:
            items = "number"
        out.add((t, items))
    return out


class ScopeCompiler:
    def __init__(self, rep: Reporter, colls: Collections) -> None:
        self.rep = rep
        self.colls = colls

    # -- fields -----------------------------------------------------------------------

    def field_decls(
        self, refs: tuple[CollectionRef, ...], name: str
    ) -> list[tuple[CollectionRef, FieldDef | None]]:
        out = []
        for ref in refs:
            version = self.colls.by_name[ref.collection].version(ref.version)
            out.append((ref, version.fields.get(name)))
        return out

    def field_ref(
        self, file: str, path: str, refs: tuple[CollectionRef, ...], name: str, use: str
    ) -> FieldRef | None:
        """A FieldRef if every scoped version declares ``name`` usably (else report)."""
        decls = self.field_decls(refs, name)
        missing = [str(ref) for ref, f in decls if f is None]
        if missing:
            self.rep.add(
                "where.undeclared", file, path,
                f"{use} field {name!r} is not declared by {', '.join(missing)}; declare it "
                "under `fields:` of every scoped collection version, or narrow `collections:`",
            )
            return None
        ok = True
        for ref, f in decls:
            assert f is not None
            if not f.filterable:
                self.rep.add(
                    "where.not_filterable", file, path,
                    f"{use} field {name!r} of {ref} is declared `filterable: false`; mark it "
                    "filterable (a scalar or array-of-scalars type) or filter on another field",
                )
                ok = False
            elif not f.required:
                self.rep.add(
                    "where.optional_annotation", file, path,
                    f"{use} field {name!r} of {ref} is backed by the optional annotator "
                    f"{f.annotator!r}, which may change after readiness; make the annotator "
                    "`required: true` or filter on a content-backed field",
                )
                ok = False
        if not ok:
            return None
        types = _merge_numeric({(f.type, f.items) for _, f in decls if f is not None})
        if len(types) > 1:
            shown = ", ".join(f"{ref}: {_type_label(f.type, f.items)}" for ref, f in decls if f)
            self.rep.add(
                "where.incompatible", file, path,
                f"{use} field {name!r} has incompatible types across the scope ({shown}); "
                "declare one type in every scoped collection version or narrow the scope",
            )
            return None
        type_, items = types.pop()
        bindings = tuple(
            FieldBinding(
                collection=ref.collection, version=ref.version, backing=f.backing,
                path=f.path, annotator=f.annotator,
            )
            for ref, f in decls
            if f is not None
        )
        return FieldRef(name=name, type=type_, items=items, bindings=bindings)  # type: ignore[arg-type]

    # -- where ------------------------------------------------------------------------

    def where(
        self, file: str, path: str, refs: tuple[CollectionRef, ...], where: dict[str, PredicateSpec]
    ) -> tuple[WherePredicate, ...] | None:
        preds: list[WherePredicate] = []
        ok = True
        for name in sorted(where):
            spec = where[name]
            fpath = join(join(path, "where"), name)
            ops = sorted(
                ("in" if f == "in_" else f for f in spec.model_fields_set), key=_OP_ORDER.index
            )
            if not ops:
                self.rep.add(
                    "where.empty", file, fpath,
                    f"where field {name!r} has no operator; add one of {', '.join(_OP_ORDER)}",
                )
                ok = False
                continue
            ref = self.field_ref(file, fpath, refs, name, "where")
            if ref is None:
                ok = False
                continue
            for op in ops:
                raw = getattr(spec, "in_" if op == "in" else op)
                value = self._operand(file, join(fpath, op), ref, op, raw)
                if value is _values.MISSING:
                    ok = False
                    continue
                preds.append(WherePredicate(field=ref, op=op, value=value))  # type: ignore[arg-type]
        return tuple(preds) if ok else None

    def _operand(self, file: str, path: str, ref: FieldRef, op: str, raw: Any) -> Any:
        label = _type_label(ref.type, ref.items)

        def bad(msg: str) -> Any:
            self.rep.add(
                "where.incompatible", file, path,
                f"`{op}` on field {ref.name!r} ({label}): {msg}",
            )
            return _values.MISSING

        if op == "exists":
            return raw if isinstance(raw, bool) else bad("write `exists: true` or `exists: false`")
        is_array = ref.type == "array"
        if op in ("contains_any", "contains_all") and not is_array:
            return bad(f"{op} needs an array field; use `in:` or `eq:` on a scalar field")
        if op == "in" and is_array:
            return bad("`in` needs a scalar field; use `contains_any:` on an array field")
        if op in ("gt", "gte", "lt", "lte"):
            if is_array:
                return bad("comparisons need a scalar field; use contains_any/contains_all")
            if ref.type not in _values.ORDERED:
                return bad(f"{ref.type} fields are not ordered; use `eq:` or `in:`")
        element_type = ref.items if is_array else ref.type
        assert element_type is not None
        wants_list = op in ("in", "contains_any", "contains_all") or (op == "eq" and is_array)
        if wants_list:
            if not isinstance(raw, list) or not raw:
                return bad(f"write a non-empty list of {element_type} values, e.g. [a, b]")
            try:
                values = [_values.normalize_operand(element_type, v) for v in raw]
            except _values.Mismatch as exc:
                return bad(f"{exc}; every listed value must be {_values.article(element_type)}")
            if op == "eq":
                return values  # array equality is ordered
            return sorted(set(values), key=_values.sort_key)
        if raw is None:
            return bad("the operand is null; use `exists: false` to match an absent field")
        try:
            return _values.normalize_operand(element_type, raw)
        except _values.Mismatch as exc:
            return bad(f"{exc}; write {_values.article(element_type)} value")

    # -- scopes ------------------------------------------------------------------------

    def scope(
        self, file: str, path: str, kind: str, spec: ScopeSpec, d: Derivation
    ) -> Scope | None:
        before = self.rep.count()
        src = d.source
        consuming = kind in CONSUMING_KINDS
        inherited = spec.collections is None
        refs: list[CollectionRef] = []
        if spec.collections is None:
            refs = list(src.collections)
        elif not spec.collections:
            self._empty(file, join(path, "collections"), "collections")
        else:
            for i, text in enumerate(spec.collections):
                ref = self.colls.resolve(self.rep, file, join(join(path, "collections"), i), text)
                if ref is not None and ref not in refs:
                    refs.append(ref)
        types = self._part(file, path, "types", spec.types, src.types, consuming or inherited)
        statuses = self._part(
            file, path, "statuses", spec.statuses, src.statuses, consuming or inherited
        )
        if self.rep.count() > before:
            return None
        refs.sort(key=lambda r: (r.collection, r.version))
        if consuming:
            self._subset(file, path, kind, refs, types, statuses, d)
        self.known_types(file, path, refs, types)
        keyed = self._keyed(file, path, kind, spec, refs)
        where = self.where(file, path, tuple(refs), spec.where)
        if self.rep.count() > before or where is None:
            return None
        return Scope(
            collections=tuple(refs), types=types, statuses=statuses, keyed=keyed, where=where
        )

    def _empty(self, file: str, path: str, part: str) -> None:
        self.rep.add(
            "scope.empty", file, path,
            f"`{part}: []` matches nothing; list at least one value or omit the key",
        )

    def _part(
        self, file: str, path: str, part: str, given: list[str] | None,
        source: tuple[str, ...] | None, inherit: bool,
    ) -> tuple[str, ...] | None:
        if given is None:
            return source if inherit else None
        if not given:
            self._empty(file, join(path, part), part)
            return None
        return dedupe_sorted(given)

    def _subset(
        self, file: str, path: str, kind: str, refs: list[CollectionRef],
        types: tuple[str, ...] | None, statuses: tuple[str, ...] | None, d: Derivation,
    ) -> None:
        src = d.source
        consumed = ", ".join(str(r) for r in src.collections)
        for ref in refs:
            if ref in src.collections:
                continue
            coll = self.colls.by_name[ref.collection]
            note = "" if coll.version(ref.version).consumable else (
                f" ({ref} is declared consumable: false, so no cursor consumes it)"
            )
            self.rep.add(
                "scope.not_subset", file, join(path, "collections"),
                f"{kind} scope includes {ref}, which derivation {d.name!r} does not consume "
                f"(its source reads {consumed}){note}; a {kind} record outside the driving "
                f"source would sit above the cursor forever — add {ref} to the derivation's "
                "source.collections or remove it from this scope",
            )
        parts = (("types", types, src.types), ("statuses", statuses, src.statuses))
        for part, mine, theirs in parts:
            if theirs is None:
                continue
            extra = sorted(set(mine or ()) - set(theirs)) if mine is not None else ["<any>"]
            if extra:
                self.rep.add(
                    "scope.not_subset", file, join(path, part),
                    f"{kind} scope {part} {', '.join(extra)} not in the source {part} of "
                    f"derivation {d.name!r} ({', '.join(theirs)}); narrow this list to a subset "
                    f"of the source's, or widen the derivation's source.{part}",
                )

    def known_types(
        self, file: str, path: str, refs: list[CollectionRef], types: tuple[str, ...] | None
    ) -> None:
        if types is None or not refs:
            return
        declared: set[str] = set()
        for ref in refs:
            coll_types = self.colls.by_name[ref.collection].types
            if coll_types is None:
                return  # an open type space: anything may appear
            declared.update(coll_types)
        unknown = [t for t in types if t not in declared]
        if unknown:
            self.rep.add(
                "scope.unknown_type", file, join(path, "types"),
                f"type(s) {', '.join(unknown)} are not declared by the scoped collections "
                f"(declared: {', '.join(sorted(declared))}); fix the type names or add them to "
                "the collection's `types:`",
            )

    def _keyed(
        self, file: str, path: str, kind: str, spec: ScopeSpec, refs: list[CollectionRef]
    ) -> bool | None:
        events = [str(r) for r in refs if not r.keyed]
        keyed_refs = [str(r) for r in refs if r.keyed]
        if kind in _KEYED_KINDS:
            if spec.keyed is False:
                self.rep.add(
                    "scope.not_keyed", file, join(path, "keyed"),
                    f"a {kind} condition watches keyed heads, so `keyed: false` can never "
                    "match; remove `keyed: false` (or use a write condition for event rows)",
                )
            if events:
                what = "is an event collection" if len(events) == 1 else "are event collections"
                verb = "change" if kind == "changed" else "retract"
                self.rep.add(
                    "scope.not_keyed", file, join(path, "collections"),
                    f"{', '.join(events)} {what} (keyed: false), which never has heads to "
                    f"{verb}; scope keyed collections only, or use a write condition",
                )
            return True
        if spec.keyed is True and events:
            self.rep.add(
                "scope.keyed_mismatch", file, join(path, "keyed"),
                f"`keyed: true` but {', '.join(events)} "
                f"{'is an event collection' if len(events) == 1 else 'are event collections'}; "
                "drop `keyed:` or remove those collections from the scope",
            )
        if spec.keyed is False and keyed_refs:
            self.rep.add(
                "scope.keyed_mismatch", file, join(path, "keyed"),
                f"`keyed: false` but {', '.join(keyed_refs)} "
                f"{'is' if len(keyed_refs) == 1 else 'are'} keyed; drop `keyed:` or remove "
                "those collections from the scope",
            )
        if spec.keyed is not None:
            return spec.keyed
        shapes = {r.keyed for r in refs}
        return shapes.pop() if len(shapes) == 1 else None
