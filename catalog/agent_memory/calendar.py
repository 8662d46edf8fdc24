"""reminders: a reminder for every calendar event starting within the next hour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agent_memory._util import content, live

LEAD = timedelta(hours=1)


def _parse(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def remind(ctx: Any) -> list[dict[str, Any]]:
    out = []
    for r in live(ctx.records):
        starts = _parse(content(r).get("starts_at"))
        if starts is None or not timedelta(0) <= starts - ctx.now <= LEAD:
            continue
        title = str(content(r).get("title", "an event"))
        minutes = int((starts - ctx.now).total_seconds() // 60)
        out.append({
            "collection": "reminders",
            "type": "reminder",
            "content": {"event_key": r.get("key"), "title": title,
                        "starts_at": starts.isoformat().replace("+00:00", "Z")},
            "text": f"{title} starts in {minutes} minutes.",
        })
    return sorted(out, key=lambda e: (e["content"]["starts_at"], str(e["content"]["event_key"])))
