"""Shared pieces of the compiler: the issue reporter, name and reference checks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from wakeline.catalog._yaml import LoadedDoc
from wakeline.catalog.errors import CatalogIssue
from wakeline.catalog.normalized import Collection, CollectionRef

NAME_RE = re.compile(r"^[a-z][a-z0-9._-]{0,63}$")
FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DOTTED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
REF_RE = re.compile(r"^(?P<name>[^@]+)(@(?P<version>.*))?$")

MIN_DURATION_S = 1
MAX_DURATION_S = 7 * 24 * 3600
MAX_OFFSET_S = 366 * 24 * 3600


@dataclass
class Reporter:
    """Collects issues (and warnings) with the line of each YAML path."""

    docs: dict[str, LoadedDoc] = field(default_factory=dict)
    issues: list[CatalogIssue] = field(default_factory=list)
    warnings: list[CatalogIssue] = field(default_factory=list)

    def _issue(self, code: str, file: str, path: str, message: str) -> CatalogIssue:
        doc = self.docs.get(file)
        line = doc.line_of(path) if doc is not None else None
        return CatalogIssue(file, path, code, message, line)

    def add(self, code: str, file: str, path: str, message: str) -> None:
        self.issues.append(self._issue(code, file, path, message))

    def warn(self, code: str, file: str, path: str, message: str) -> None:
        self.warnings.append(self._issue(code, file, path, message))

    def count(self) -> int:
        return len(self.issues)


def check_name(rep: Reporter, file: str, path: str, name: str, what: str) -> bool:
    if NAME_RE.match(name):
        return True
    rep.add(
        "name.invalid", file, path,
        f"{what} name {name!r} must match ^[a-z][a-z0-9._-]{{0,63}}$ (start with a lowercase "
        "letter; lowercase letters, digits, '.', '_', '-'; at most 64 characters); rename it",
    )
    return False


def check_duration(
    rep: Reporter, file: str, path: str, value: int | None, what: str,
    low: int = MIN_DURATION_S, high: int = MAX_DURATION_S,
) -> bool:
    if value is None or low <= value <= high:
        return True
    rep.add(
        "duration.range", file, path,
        f"{what} is {value} s, outside {low} s – {high} s ({high // 86400} days); "
        f"set a value between {low} and {high}",
    )
    return False


@dataclass
class Collections:
    """The compiled collections plus the names of ones that failed (no cascading errors)."""

    by_name: dict[str, Collection] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)

    def resolve(
        self, rep: Reporter, file: str, path: str, text: str
    ) -> CollectionRef | None:
        """``name`` or ``name@version`` → a CollectionRef (active version by default)."""
        m = REF_RE.match(text)
        name = m.group("name") if m else text
        coll = self.by_name.get(name)
        if coll is None:
            if name not in self.broken:
                known = ", ".join(sorted(self.by_name)) or "none"
                rep.add(
                    "collection.unknown", file, path,
                    f"unknown collection {name!r} (declared: {known}); add "
                    f"collections/{name}.yaml or fix the name",
                )
            return None
        version_text = m.group("version") if m else None
        if version_text is None:
            return CollectionRef(collection=name, version=coll.active_version, keyed=coll.keyed)
        declared = [v.version for v in coll.versions]
        if not version_text.isdigit() or int(version_text) not in declared:
            rep.add(
                "collection.unknown_version", file, path,
                f"collection {name!r} has no version {version_text!r} (declared: "
                f"{', '.join(map(str, declared))}); write {name}@<declared version> or omit "
                "@version to use the active version",
            )
            return None
        return CollectionRef(collection=name, version=int(version_text), keyed=coll.keyed)


def dedupe_sorted(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(sorted(set(values)))
