"""From a change-topic message to the core's events (through ``wakeline.cdc.envelope``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wakeline.cdc import envelope
from wakeline.cdc.dlq import dead_letter_headers
from wakeline.cdc.errors import EnvelopeError
from wakeline.core.events import Event


@dataclass(frozen=True)
class Decoded:
    entity: tuple[str, str] | None = None
    events: list[Event] = field(default_factory=list)
    error: str | None = None
    code: str = ""


def decode_change(key: bytes | None, value: bytes | None) -> Decoded:
    try:
        parsed = envelope.parse(value, key)
    except EnvelopeError as exc:
        return Decoded(error=str(exc), code=exc.code)
    if parsed is None or isinstance(parsed, envelope.TransactionMarker):
        return Decoded()
    ident = (parsed.workspace, parsed.entity)
    if isinstance(parsed, envelope.CursorAdvance):
        adv = parsed.cursor_advanced()
        return Decoded(ident, [adv] if adv is not None else [])
    return Decoded(ident, [parsed.record_changed()])


async def dead_letter(rt: Any, event: Any, code: str, reason: str) -> None:
    """Send the original bytes with the reason and their coordinates (the format of
    :mod:`wakeline.cdc.dlq`); the stream goes on."""
    msg = event.message
    headers = dead_letter_headers(code=code, reason=reason, value=event.value,
                                  topic=str(msg.topic), partition=msg.partition,
                                  offset=msg.offset)
    await rt.dead_letter_topic.send(key=event.key, value=event.value,
                                    headers={k: v for k, v in headers if v is not None})
