"""session_summary: one summary per conversation in the settled batch."""

from __future__ import annotations

from typing import Any

from agent_memory._util import clip, content, live


def summarize(ctx: Any) -> list[dict[str, Any]]:
    sessions: dict[str, list[Any]] = {}
    for r in live(ctx.records):
        if r.get("type") == "chat":
            sessions.setdefault(str(content(r).get("session_id", "default")), []).append(r)
    out = []
    for sid in sorted(sessions):
        rows = sessions[sid]
        speakers = sorted({str(content(r).get("speaker", "unknown")) for r in rows})
        text = (
            f"Session {sid}: {len(rows)} message{'s' if len(rows) != 1 else ''} between "
            f"{', '.join(speakers)}. Opened with {clip(rows[0].get('text', ''))!r}; "
            f"ended with {clip(rows[-1].get('text', ''))!r}."
        )
        out.append({
            "collection": "session_summaries",
            "type": "summary",
            "content": {
                "session_id": sid,
                "message_count": len(rows),
                "speakers": speakers,
                "first_seq": rows[0].get("seq"),
                "last_seq": rows[-1].get("seq"),
            },
            "text": text,
        })
    return out
