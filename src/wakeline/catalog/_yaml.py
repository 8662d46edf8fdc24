"""Load one YAML document with line numbers and the traps PyYAML hides.

PyYAML's ``safe_load`` silently turns an unquoted ``on:`` key into the boolean
``True`` and keeps only the last of two duplicate keys.  This loader composes the
node tree and constructs values itself so it can report both, and records the line
of every mapping key so issues can point at ``file:line``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from wakeline.catalog.errors import CatalogIssue

_BOOL_TAG = "tag:yaml.org,2002:bool"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_MAX_DEPTH = 64


@dataclass
class LoadedDoc:
    """A parsed document: its data, the line of each YAML path, and load issues."""

    file: str
    data: Any = None
    lines: dict[str, int] = field(default_factory=dict)
    issues: list[CatalogIssue] = field(default_factory=list)

    def line_of(self, path: str) -> int | None:
        """The line of ``path`` or of its nearest ancestor that has one."""
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:cut] if cut > 0 else ""


def join(path: str, key: str | int) -> str:
    """Extend a YAML path: ``join("a", "b") == "a.b"``, ``join("a", 0) == "a[0]"``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def load_yaml(path: Path, display: str) -> LoadedDoc:
    doc = LoadedDoc(file=display)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        doc.issues.append(
            CatalogIssue(
                display, "", "yaml.unreadable",
                f"cannot read the file ({exc}); make it a readable UTF-8 text file",
            )
        )
        return doc
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        if "another document" in problem or "single document" in problem:
            problem += " (a catalog file holds exactly one YAML document: remove the `---`)"
        doc.issues.append(
            CatalogIssue(
                display, "", "yaml.unreadable",
                f"invalid YAML: {problem}; fix the syntax near line {line} "
                "(check indentation, quoting and colons)",
                line,
            )
        )
        return doc
    except yaml.YAMLError as exc:
        doc.issues.append(
            CatalogIssue(
                display, "", "yaml.unreadable",
                f"invalid YAML: {exc}; a catalog file holds exactly one YAML document",
            )
        )
        return doc
    if node is None:
        return doc
    builder = _Builder(doc)
    try:
        doc.data = builder.build(node, "", 0)
    except yaml.YAMLError as exc:  # a malformed scalar (e.g. an impossible timestamp)
        doc.issues.append(
            CatalogIssue(display, "", "yaml.unreadable", f"invalid YAML value: {exc}; fix it")
        )
        doc.data = None
    return doc


class _Builder:
    def __init__(self, doc: LoadedDoc) -> None:
        self.doc = doc
        self.constructor = SafeConstructor()

    def build(self, node: Node, path: str, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise yaml.YAMLError(f"nesting deeper than {_MAX_DEPTH} levels at {path or '<root>'}")
        if isinstance(node, ScalarNode):
            return self.constructor.construct_object(node, deep=True)
        if isinstance(node, SequenceNode):
            return [self.build(item, join(path, i), depth + 1) for i, item in enumerate(node.value)]
        if isinstance(node, MappingNode):
            return self._mapping(node, path, depth)
        raise yaml.YAMLError(f"unsupported YAML node at {path or '<root>'}")

    def _mapping(self, node: MappingNode, path: str, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged = self.build(value_node, path, depth + 1)
                for item in merged if isinstance(merged, list) else [merged]:
                    if isinstance(item, dict):
                        for k, v in item.items():
                            out.setdefault(k, v)
                continue
            line = key_node.start_mark.line + 1
            if isinstance(key_node, ScalarNode) and key_node.tag == _BOOL_TAG:
                raw = key_node.value
                as_bool = self.constructor.construct_object(key_node, deep=True)
                hint = (
                    "write `transitions:` instead (a changed condition's field is not "
                    f"called `on`), or quote the key (\"{raw}\": ...)"
                    if raw.lower() == "on"
                    else f"quote the key (\"{raw}\": ...) or use the intended key name"
                )
                self.doc.issues.append(
                    CatalogIssue(
                        self.doc.file, join(path, raw), "yaml.on_trap",
                        f"the unquoted key `{raw}` is a YAML boolean, so PyYAML reads it as "
                        f"{as_bool}; {hint}",
                        line,
                    )
                )
                continue
            if not isinstance(key_node, ScalarNode):
                self.doc.issues.append(
                    CatalogIssue(
                        self.doc.file, path, "schema.invalid",
                        "a mapping key must be a plain scalar; replace the complex key",
                        line,
                    )
                )
                continue
            key = self.constructor.construct_object(key_node, deep=True)
            key_path = join(path, key if isinstance(key, str) else str(key))
            if key in out:
                self.doc.issues.append(
                    CatalogIssue(
                        self.doc.file, key_path, "yaml.duplicate_key",
                        f"the key `{key}` appears twice in this mapping (line "
                        f"{self.doc.lines.get(key_path, '?')} and line {line}); keep one of them",
                        line,
                    )
                )
            self.doc.lines.setdefault(key_path, line)
            out[key] = self.build(value_node, key_path, depth + 1)
        return out
