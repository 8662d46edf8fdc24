"""The mixed benchmark catalog: write+where, accumulator, census, changed."""

from __future__ import annotations

import textwrap
from pathlib import Path

FILES = {
    "collections/main.yaml": """
        name: main
        keyed: false
        types: [chat, observation]
        scorers: [importance]
        fields:
          priority: integer
          tags: {type: array, items: string}
    """,
    "collections/profiles.yaml": """
        name: profiles
        keyed: true
        fields:
          value: string
    """,
    "collections/relations.yaml": """
        name: relations
        keyed: false
        types: [contradiction]
        fields:
          topic: string
    """,
    "derivations/urgent.yaml": """
        name: urgent
        function: benchfuncs:noop
        source: {collections: [main]}
        trigger:
          write: {where: {priority: {gte: 8}, tags: {contains_any: [deadline]}}}
    """,
    "derivations/reflect.yaml": """
        name: reflect
        function: benchfuncs:noop
        source: {collections: [main]}
        trigger:
          accumulator: {metric: importance, threshold: 100}
    """,
    "derivations/reconcile.yaml": """
        name: reconcile
        function: benchfuncs:noop
        source: {collections: [main]}
        trigger:
          census: {collections: [relations], types: [contradiction], threshold: 3}
    """,
    "derivations/skills.yaml": """
        name: skills
        function: benchfuncs:noop
        source: {collections: [profiles]}
        trigger:
          changed: {collections: [profiles], keys: [role]}
    """,
    "benchfuncs.py": "def noop(ctx):\n    return []\n",
}


def write(root: Path, files: dict[str, str] | None = None) -> Path:
    """Write a catalog folder: ``files`` maps relative paths to (indented) texts,
    the mixed benchmark catalog by default."""
    for rel, text in (FILES if files is None else files).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root
