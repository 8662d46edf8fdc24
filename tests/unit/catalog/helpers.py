"""Build small catalogs in a tmp directory from dicts or YAML strings."""

from __future__ import annotations

import copy
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from wakeline.catalog import CatalogIssue, CompileResult, check_catalog

MAIN: dict[str, Any] = {
    "name": "main",
    "keyed": False,
    "types": ["chat", "observation", "note"],
    "scorers": ["importance"],
    "annotators": [
        {
            "name": "sentiment_v1",
            "required": True,
            "leaves": {
                "valence": "number",
                "label": "string",
                "seen_at": "datetime",
                "topics": {"type": "array", "items": "string"},
            },
        },
        {"name": "draft_v1", "required": False, "leaves": {"score": "number", "at": "datetime"}},
    ],
    "versions": [
        {
            "version": 1,
            "fields": {
                "session_id": "string",
                "tags": {"type": "array", "items": "string"},
                "kind": "string",
                "when": "datetime",
            },
        },
        {
            "version": 2,
            "fields": {
                "session_id": "string",
                "tags": {"type": "array", "items": "string"},
                "kind": "integer",
                "when": "datetime",
                "valence": {"annotation": "sentiment_v1", "path": "valence"},
                "label": {"annotation": "sentiment_v1", "path": "label"},
                "seen_at": {"annotation": "sentiment_v1", "path": "seen_at"},
                "draft": {"annotation": "draft_v1", "path": "score"},
                "draft_at": {"annotation": "draft_v1", "path": "at"},
                "body": {"type": "string", "filterable": False},
                "flag": "boolean",
                "count": "integer",
                "score": "number",
                "payload": {"type": "object"},
                "whens": {"type": "array", "items": "datetime"},
                "nested": {"type": "string", "content": "a.b"},
            },
        },
    ],
}

PROFILES: dict[str, Any] = {
    "name": "profiles",
    "keyed": True,
    "keys": ["role", "commitments", "name"],
    "fields": {"value": {"type": "object"}, "title": "string", "due": "datetime"},
}

NOTES: dict[str, Any] = {
    "name": "notes",
    "keyed": False,
    "types": ["summary"],
    "fields": {"due": "datetime", "topic": "string"},
}

LEGACY: dict[str, Any] = {
    "name": "legacy",
    "keyed": False,
    "versions": [
        {"version": 1, "consumable": False, "fields": {"topic": "string"}},
        {"version": 2, "fields": {"topic": "string"}},
    ],
}

D: dict[str, Any] = {
    "name": "d",
    "function": "mod:fn",
    "source": {
        "collections": ["main"],
        "types": ["chat", "observation"],
        "statuses": ["active"],
    },
    "emits": ["out"],
    "trigger": {"write": {}},
}

P: dict[str, Any] = {
    "name": "p",
    "function": "mod:fn",
    "source": {"collections": ["profiles"], "statuses": ["active"], "mode": "current"},
    "emits": [],
}

BASE: dict[str, Any] = {
    "collections/main.yaml": MAIN,
    "collections/profiles.yaml": PROFILES,
    "collections/notes.yaml": NOTES,
    "collections/legacy.yaml": LEGACY,
    "collections/out.yaml": {"name": "out", "keyed": False},
    "derivations/d.yaml": D,
    "derivations/p.yaml": P,
    "mod.py": "def fn(ctx):\n    return []\n",
}


def write_catalog(root: Path, files: Mapping[str, Any]) -> Path:
    """Write ``{relative path: dict | YAML/Python text}``; a None value writes nothing."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        if content is None:
            continue
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(textwrap.dedent(content), encoding="utf-8")
        else:
            path.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    return root


def merged(base: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def with_trigger(body: Any, derivation: Mapping[str, Any] = D, **more: Any) -> dict[str, Any]:
    """Overrides that give ``derivation`` the inline trigger ``body``."""
    doc = merged(derivation, trigger=body)
    return {f"derivations/{doc['name']}.yaml": doc, **more}


def standalone(name: str, body: Mapping[str, Any], processor: str = "d") -> dict[str, Any]:
    return {f"triggers/{name}.yaml": {"name": name, "processor": processor, **body}}


def build(tmp_path: Path, overrides: Mapping[str, Any] | None = None, **kw: Any) -> CompileResult:
    content = copy.deepcopy(BASE)
    for rel, value in (overrides or {}).items():
        if value is None:
            content.pop(rel, None)
        else:
            content[rel] = value
    root = write_catalog(tmp_path / "cat", content)
    return check_catalog(root, **kw)


def only(result: CompileResult, code: str) -> CatalogIssue:
    """The single issue with ``code`` (fails with the full issue list otherwise)."""
    found = [i for i in result.issues if i.code == code]
    shown = "\n".join(i.format() for i in result.issues)
    assert len(found) >= 1, f"no {code} issue; got:\n{shown or '(none)'}"
    return found[0]


def assert_ok(result: CompileResult) -> None:
    shown = "\n".join(i.format() for i in result.issues)
    assert result.catalog is not None, f"expected a valid catalog, got:\n{shown}"
