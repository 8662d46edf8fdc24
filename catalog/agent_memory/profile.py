"""profile, skills and profile_repair: keyed profile slots and what depends on them.

Chat/observation content may carry ``facts: {slot: value}`` (extracted upstream by
the application) and ``forget: [slot, ...]``.  The latest statement per slot wins.
"""

from __future__ import annotations

from typing import Any

from agent_memory._util import by_seq, content, live

PROFILE_SLOTS = ("name", "role", "commitments", "timezone", "preferences")

#: A deliberately tiny, deterministic role → skills table.
ROLE_SKILLS = {
    "engineer": ["debugging", "system design"],
    "designer": ["prototyping", "user research"],
    "manager": ["planning", "coaching"],
    "researcher": ["experiment design", "writing"],
}


def _render(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def derive_profile(ctx: Any) -> list[dict[str, Any]]:
    latest: dict[str, tuple[int, Any]] = {}  # slot → (seq, value or None = forget)
    for r in live(ctx.records):
        seq = int(r.get("seq", 0))
        body = content(r)
        facts = body.get("facts") or {}
        if isinstance(facts, dict):
            for slot, value in facts.items():
                if slot in PROFILE_SLOTS and value is not None:
                    latest[slot] = (seq, value)
        for slot in body.get("forget") or []:
            if slot in PROFILE_SLOTS:
                latest[slot] = (seq, None)
    out: list[dict[str, Any]] = []
    for slot in sorted(latest):
        seq, value = latest[slot]
        if value is None:
            out.append({"collection": "profiles", "key": slot, "retract": True})
        else:
            out.append({
                "collection": "profiles",
                "key": slot,
                "content": {"value": value, "source_seq": seq},
                "text": f"{slot}: {_render(value)}",
            })
    return out


def derive_skills(ctx: Any) -> list[dict[str, Any]]:
    heads = {r.get("key"): content(r).get("value") for r in live(ctx.records)}
    role = heads.get("role")
    commitments = heads.get("commitments") or []
    if role is None and not commitments:
        return []
    skills = set(ROLE_SKILLS.get(str(role).lower(), [])) if role is not None else set()
    for c in commitments if isinstance(commitments, list) else [commitments]:
        words = str(c).lower().split()
        if words:
            skills.add(f"{words[0]} follow-through")
    ordered = sorted(skills)
    return [{
        "collection": "skills",
        "key": "summary",
        "content": {"role": None if role is None else str(role), "skills": ordered},
        "text": f"Role {role or 'unknown'}; skills: {', '.join(ordered) or 'none yet'}.",
    }]


def repair_after_retraction(ctx: Any) -> list[dict[str, Any]]:
    removed = sorted({r.get("key") for r in by_seq(ctx.records) if r.get("tombstone")})
    if {"role", "commitments"} & set(removed):
        return [{"collection": "skills", "key": "summary", "retract": True}]
    return []
