"""The dead-letter topic: change messages the engine cannot use, kept with the reason.

A dead letter is the ORIGINAL message — key and value bytes exactly as read —
produced to the dead-letter topic (``wakeline.dead-letter`` by default) with
these headers (all UTF-8 text):

==========================  ===================================================
``wakeline.dlq.code``       the stable reason code, e.g. ``cdc.envelope.unknown_table``
``wakeline.dlq.reason``     the human reason (at most 1000 characters)
``wakeline.dlq.topic``      where the message was read
``wakeline.dlq.partition``  its partition
``wakeline.dlq.offset``     its offset
``wakeline.dlq.timestamp``  its Kafka timestamp (ms), when it had one
``wakeline.dlq.size``       the value's length in bytes
``wakeline.dlq.at``         when it was dead-lettered (ISO-8601 UTC)
``wakeline.dlq.truncated``  ``"true"`` only when the value had to be cut to fit
==========================  ===================================================

Keeping the bytes untouched means a fixed consumer can replay them.  Only a
value the broker refuses (larger than the dead-letter topic accepts) is cut to
``fallback_bytes`` and marked truncated rather than lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from confluent_kafka import KafkaError, Message, Producer

from wakeline.cdc._kafka import producer_config
from wakeline.cdc.errors import CdcError, EnvelopeError

DEFAULT_DLQ_TOPIC: Final = "wakeline.dead-letter"
H: Final = "wakeline.dlq."


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered message, as read back from the dead-letter topic."""

    code: str
    reason: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    size: int | None = None
    at: str | None = None
    truncated: bool = False

    @classmethod
    def from_message(cls, msg: Message) -> DeadLetter:
        """Decode a message read from the dead-letter topic."""
        raw = msg.headers() or []
        pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
        headers = {k: (v.decode("utf-8") if isinstance(v, bytes) else v or "")
                   for k, v in pairs}

        def num(name: str) -> int | None:
            v = headers.get(H + name)
            return int(v) if v not in (None, "") else None

        return cls(
            code=headers.get(H + "code", ""),
            reason=headers.get(H + "reason", ""),
            topic=headers.get(H + "topic", ""),
            partition=_or(num("partition"), -1),
            offset=_or(num("offset"), -1),
            key=msg.key(),
            value=msg.value(),
            timestamp_ms=num("timestamp"),
            size=num("size"),
            at=headers.get(H + "at"),
            truncated=headers.get(H + "truncated") == "true",
        )


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def dead_letter_headers(*, code: str, reason: str, value: bytes | None, topic: str,
                        partition: int, offset: int, timestamp_ms: int | None = None
                        ) -> list[tuple[str, str | bytes | None]]:
    """The headers of a dead letter (the one format, for every producer of them)."""
    headers: list[tuple[str, str | bytes | None]] = [
        (H + "code", code.encode()),
        (H + "reason", reason[:1000].encode("utf-8", "replace")),
        (H + "topic", topic.encode()),
        (H + "partition", str(partition).encode()),
        (H + "offset", str(offset).encode()),
        (H + "size", str(len(value) if value is not None else 0).encode()),
        (H + "at", datetime.now(UTC).isoformat(timespec="milliseconds")
         .replace("+00:00", "Z").encode()),
    ]
    if timestamp_ms is not None:
        headers.append((H + "timestamp", str(timestamp_ms).encode()))
    return headers


class DeadLetterWriter:
    """Produces dead letters; :meth:`flush` before committing the source offsets.

    :param bootstrap: brokers (or pass ``producer``).
    :param topic: the dead-letter topic.
    :param fallback_bytes: size a refused value is cut to.
    """

    def __init__(self, bootstrap: str | None = None, *, topic: str = DEFAULT_DLQ_TOPIC,
                 producer: Producer | None = None, config: Mapping[str, Any] | None = None,
                 fallback_bytes: int = 512 * 1024) -> None:
        if producer is None:
            if not bootstrap:
                raise ValueError("a bootstrap address or a producer is required")
            # Plain (not idempotent): dead letters have no order to keep.
            producer = Producer(producer_config(bootstrap, {
                "enable.idempotence": False, "enable.gapless.guarantee": False,
                **(config or {})}))
        self.producer = producer
        self.topic = topic
        self.fallback_bytes = fallback_bytes
        self.written = 0
        self._failed: list[tuple[KafkaError, list[tuple[str, str | bytes | None]],
                                 bytes | None, bytes | None]] = []

    def write(self, *, code: str, reason: str, key: bytes | None, value: bytes | None,
              topic: str, partition: int, offset: int,
              timestamp_ms: int | None = None) -> None:
        """Queue one dead letter (asynchronous; :meth:`flush` waits for it)."""
        self._produce(key, value, dead_letter_headers(
            code=code, reason=reason, value=value, topic=topic, partition=partition,
            offset=offset, timestamp_ms=timestamp_ms))

    def write_error(self, error: EnvelopeError | CdcError, msg: Message) -> None:
        """Dead-letter ``msg`` (a message read from Kafka) for ``error``."""
        ts_type, ts = msg.timestamp()
        self.write(code=error.code, reason=str(error), key=msg.key(),
                   value=msg.value(), topic=msg.topic() or "",
                   partition=msg.partition() or 0, offset=msg.offset() or 0,
                   timestamp_ms=ts if ts_type else None)

    def _produce(self, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, str | bytes | None]]) -> None:
        def done(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                self._failed.append((err, headers, key, value))
            else:
                self.written += 1

        while True:
            try:
                self.producer.produce(self.topic, value, key, headers=headers, on_delivery=done)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every dead letter is acknowledged.

        A value the broker refuses as too large is written again cut to
        ``fallback_bytes`` (header ``wakeline.dlq.truncated``).

        :raises CdcError: a dead letter could not be written; do not commit the
            offsets of the messages it holds.
        """
        remaining = self.producer.flush(timeout)
        retry, self._failed = self._failed, []
        for err, headers, key, value in retry:
            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE and value is not None:
                self._produce(key, value[: self.fallback_bytes],
                              [*headers, (H + "truncated", b"true")])
            else:
                self._failed.append((err, headers, key, value))
        if retry:
            remaining = self.producer.flush(timeout)
        if remaining or self._failed:
            first = self._failed[0][0] if self._failed else f"{remaining} unacknowledged"
            raise CdcError(f"dead-letter topic {self.topic!r} did not take every message: "
                           f"{first}", topic=self.topic)


def read_dead_letters(bootstrap: str, topic: str = DEFAULT_DLQ_TOPIC, *,
                      timeout: float = 10.0, expect: int | None = None,
                      partitions: Sequence[int] | None = None) -> list[DeadLetter]:
    """Every dead letter on ``topic`` from the beginning (tools and tests).

    Reads until ``expect`` letters arrived or no message came for a second.
    """
    from wakeline.cdc.consumer import read_all

    msgs = read_all(bootstrap, topic, timeout=timeout, expect=expect, partitions=partitions)
    return [DeadLetter.from_message(m) for m in msgs]
