"""From a change-topic message to the core's events (through ``wakeline.cdc.envelope``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from wakeline.cdc import envelope
from wakeline.cdc.errors import EnvelopeError
from wakeline.core.events import Event


@dataclass(frozen=True)
class Decoded:
    entity: tuple[str, str] | None = None
    events: list[Event] = field(default_factory=list)
    error: str | None = None


def decode_change(key: bytes | None, value: bytes | None) -> Decoded:
    try:
        parsed = envelope.parse(value, key)
    except EnvelopeError as exc:
        return Decoded(error=f"{exc.code}: {exc}")
    if parsed is None or isinstance(parsed, envelope.TransactionMarker):
        return Decoded()
    ident = (parsed.workspace, parsed.entity)
    if isinstance(parsed, envelope.CursorAdvance):
        adv = parsed.cursor_advanced()
        return Decoded(ident, [adv] if adv is not None else [])
    return Decoded(ident, [parsed.record_changed()])


async def dead_letter(rt: Any, event: Any, reason: str) -> None:
    """Send the original bytes with the reason and their coordinates; the stream goes on."""
    msg = event.message
    topic = rt.dead_letter_topic
    headers = {"wakeline.reason": reason.encode(), "wakeline.topic": str(msg.topic).encode(),
               "wakeline.partition": str(msg.partition).encode(),
               "wakeline.offset": str(msg.offset).encode()}
    body = json.dumps({"reason": reason, "topic": msg.topic, "partition": msg.partition,
                       "offset": msg.offset}).encode()
    await topic.send(key=event.key, value=event.value if event.value is not None else body,
                     headers=headers)
