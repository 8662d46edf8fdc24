"""reflection: a reflection over the most important pending records."""

from __future__ import annotations

from typing import Any

from agent_memory._util import clip, live


def _importance(record: Any) -> float:
    value = (record.get("scores") or {}).get("importance")
    return float(value) if isinstance(value, int | float) else 0.0


def reflect(ctx: Any) -> list[dict[str, Any]]:
    rows = live(ctx.records)
    if not rows:
        return []
    total = sum(_importance(r) for r in rows)
    top = sorted(rows, key=lambda r: (-_importance(r), r.get("seq", 0)))[:3]
    why = ",".join(sorted(ctx.reasons)) or "manual"
    highlights = "; ".join(clip(r.get("text", ""), 60) for r in top)
    return [{
        "collection": "reflections",
        "type": "reflection",
        "content": {
            "importance_total": total,
            "record_count": len(rows),
            "top_seqs": [r.get("seq") for r in top],
            "trigger": why,
        },
        "text": f"Across {len(rows)} records (importance {total:g}) the themes were: {highlights}",
    }]
