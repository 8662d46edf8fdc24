"""Small catalogs for condition-core tests, written to a tmp dir and simulated."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from wakeline.testing import Simulator

COLLECTIONS = {
    "main": """
        name: main
        keyed: false
        types: [chat, observation]
        scorers: [importance]
        annotators:
          - name: mood_v1
            required: true
            leaves: {valence: number, label: string}
        fields:
          session: string
          tags: {type: array, items: string}
          priority: integer
          weight: number
          when: datetime
          urgent: boolean
          valence: {annotation: mood_v1, path: valence}
    """,
    "profiles": """
        name: profiles
        keyed: true
        fields:
          value: string
          due: datetime
    """,
    "calendar": """
        name: calendar
        keyed: true
        fields:
          title: string
          starts_at: datetime
    """,
    "relations": """
        name: relations
        keyed: false
        types: [contradiction, support]
        fields:
          topic: string
    """,
    "out": """
        name: out
        keyed: false
        fields:
          n: integer
    """,
    "outk": """
        name: outk
        keyed: true
        fields:
          n: integer
    """,
}

FUNCS = '''
def noop(ctx):
    return []

def count(ctx):
    return [{"collection": "out", "type": "run", "content": {"n": len(ctx.records)}}]

def echo_profile(ctx):
    out = []
    for r in ctx.records:
        c = r["content"]
        if "set" in c:
            out.append({"collection": "profiles", "key": c["set"], "content": {"value": c.get("value", "")},
                        "text": str(c.get("value", ""))})
        if "unset" in c:
            out.append({"collection": "profiles", "key": c["unset"], "retract": True})
    return out
'''


def catalog_dir(tmp_path: Path, derivations: dict[str, str],
                triggers: dict[str, str] | None = None) -> Path:
    root = tmp_path / "cat"
    for sub in ("collections", "derivations", "triggers"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for name, text in COLLECTIONS.items():
        (root / "collections" / f"{name}.yaml").write_text(textwrap.dedent(text))
    for name, text in derivations.items():
        (root / "derivations" / f"{name}.yaml").write_text(textwrap.dedent(text))
    for name, text in (triggers or {}).items():
        (root / "triggers" / f"{name}.yaml").write_text(textwrap.dedent(text))
    (root / "simfuncs.py").write_text(FUNCS)
    return root


def sim_for(tmp_path: Path, derivations: dict[str, str], triggers: dict[str, str] | None = None,
            start: str = "2026-07-19T09:00:00Z", **kw: Any) -> Simulator:
    return Simulator(catalog_dir(tmp_path, derivations, triggers), start=start, **kw)


def derivation(name: str, trigger: str | None = None, *, source: str = "collections: [main]",
               function: str = "simfuncs:noop", emits: str = "[]", mode: str = "changes",
               extra: str = "") -> str:
    body = (f"name: {name}\nfunction: {function}\nsource:\n  {source}\n  mode: {mode}\n"
            f"emits: {emits}\n{extra}")
    if trigger:
        body += "trigger:\n" + textwrap.indent(textwrap.dedent(trigger).strip("\n"), "  ") + "\n"
    return body


def chat(sim: Simulator, entity: str = "user:mia", **kw: Any) -> int:
    kw.setdefault("type", "chat")
    kw.setdefault("annotations", {"mood_v1": {"valence": 0.0, "label": "calm"}})
    return sim.write(entity=entity, collection="main", **kw)


def reasons(sim: Simulator) -> list[list[str]]:
    return [r["trigger_reasons"] for r in sim.runs]
