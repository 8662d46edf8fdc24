"""contradiction_detect and reconcile."""

from __future__ import annotations

from typing import Any

from agent_memory._util import content, live
from agent_memory.profile import PROFILE_SLOTS


def detect_contradictions(ctx: Any) -> list[dict[str, Any]]:
    """Claims ``{key, value}`` with the same key and different values conflict."""
    claims: dict[str, dict[str, int]] = {}  # key → value → first seq
    for r in live(ctx.records):
        claim = content(r).get("claim")
        if isinstance(claim, dict) and isinstance(claim.get("key"), str):
            claims.setdefault(claim["key"], {}).setdefault(str(claim.get("value")), r.get("seq"))
    out = []
    for key in sorted(claims):
        values = claims[key]
        if len(values) < 2:
            continue
        ordered = sorted(values)
        out.append({
            "collection": "relations",
            "type": "contradiction",
            "content": {
                "subject": key,
                "values": ordered,
                "severity": len(ordered),
                "seqs": sorted(values.values()),
            },
            "text": f"Conflicting claims about {key}: {' vs '.join(ordered)}",
        })
    return out


def reconcile(ctx: Any) -> list[dict[str, Any]]:
    """Withdraw every contradicted profile slot and record one resolution per subject."""
    subjects = sorted({
        str(content(r).get("subject"))
        for r in live(ctx.records)
        if r.get("type") == "contradiction" and content(r).get("subject")
    })
    out: list[dict[str, Any]] = []
    for subject in subjects:
        if subject in PROFILE_SLOTS:
            out.append({"collection": "profiles", "key": subject, "retract": True})
        out.append({
            "collection": "resolutions",
            "type": "resolution",
            "content": {"subject": subject, "action": "withdrawn pending confirmation"},
            "text": f"Withdrew the belief about {subject} until the user confirms it.",
        })
    return out
