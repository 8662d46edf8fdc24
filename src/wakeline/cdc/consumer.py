"""Read the change topic: parse, dead-letter what does not parse, yield the rest.

:class:`ChangeConsumer` wraps a confluent-kafka consumer.  For every message it
calls :func:`wakeline.cdc.envelope.parse`; an :class:`EnvelopeError` sends the
message to the dead-letter topic (:class:`~wakeline.cdc.dlq.DeadLetterWriter`)
and the stream goes on.  Kafka tombstones (null values) are counted and
skipped.  Nothing is committed implicitly: :meth:`ChangeConsumer.commit`
first flushes the dead letters, then commits the offsets of everything
returned so far, so a crash redelivers (at least once) rather than loses.

Two modes: with a ``group_id`` it subscribes (a consumer group, offsets kept by
the broker); without, it assigns every partition from ``start`` (``"beginning"``
or ``"end"``) and keeps no offsets — for tools, tests and Tansu (whose group
join is slow).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition
from confluent_kafka import Message as KafkaMessage

from wakeline.cdc.dlq import DEFAULT_DLQ_TOPIC, DeadLetterWriter
from wakeline.cdc.envelope import DEFAULT_MAX_BYTES, TABLES, Parsed, parse
from wakeline.cdc.errors import CdcError, EnvelopeError


@dataclass(frozen=True)
class Consumed:
    """A parsed event with where it was read."""

    event: Parsed
    topic: str
    partition: int
    offset: int
    key: bytes | None
    timestamp_ms: int | None = None


@dataclass
class ConsumerStats:
    good: int = 0
    dead_lettered: int = 0
    tombstones: int = 0
    by_code: dict[str, int] = field(default_factory=dict)


def _assign_all(consumer: Consumer, topic: str, start: int,
                partitions: Sequence[int] | None, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        meta = consumer.list_topics(topic, timeout=max(0.5, deadline - time.monotonic()))
        t = meta.topics.get(topic)
        if t is not None and t.error is None and t.partitions:
            parts = sorted(t.partitions) if partitions is None else list(partitions)
            consumer.assign([TopicPartition(topic, p, start) for p in parts])
            return parts
        if time.monotonic() >= deadline:
            raise CdcError(f"topic {topic!r} not found", topic=topic)
        time.sleep(0.1)


class ChangeConsumer:
    """Consumes the change topic and yields good events.

    :param bootstrap: brokers.
    :param topic: the change topic.
    :param group_id: consumer group (None: assign every partition, no offsets).
    :param dead_letters: where bad messages go (default: a writer to
        ``dlq_topic`` on the same brokers).
    :param max_bytes: size limit passed to :func:`parse`.
    :param start: ``"beginning"`` or ``"end"`` — where a new group / an
        assignment starts.
    """

    def __init__(self, bootstrap: str, topic: str, group_id: str | None = None, *,
                 dead_letters: DeadLetterWriter | None = None,
                 dlq_topic: str = DEFAULT_DLQ_TOPIC, max_bytes: int = DEFAULT_MAX_BYTES,
                 tables: frozenset[str] = TABLES, start: str = "beginning",
                 partitions: Sequence[int] | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        if start not in ("beginning", "end"):
            raise ValueError("start must be 'beginning' or 'end'")
        self.topic = topic
        self.max_bytes = max_bytes
        self.tables = tables
        self.dead_letters = dead_letters or DeadLetterWriter(bootstrap, topic=dlq_topic)
        self.stats = ConsumerStats()
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group_id or f"wakeline-reader-{id(self):x}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest" if start == "beginning" else "latest",
            # Tansu answers JoinGroup after half the session timeout.
            "session.timeout.ms": 6000,
            # Big values must not stall the fetch loop.
            "fetch.message.max.bytes": max(max_bytes * 2, 1 << 20),
            "log_level": 3,
            **(config or {}),
        }
        self._consumer = Consumer(conf)
        self._grouped = group_id is not None
        self._pending: dict[tuple[str, int], int] = {}
        if self._grouped:
            self._consumer.subscribe([topic])
        else:
            _assign_all(self._consumer, topic,
                        OFFSET_BEGINNING if start == "beginning" else OFFSET_END,
                        partitions, 30.0)

    def _handle(self, msg: KafkaMessage) -> Consumed | None:
        topic, part, off = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
        self._pending[(topic, part)] = off + 1
        value, key = msg.value(), msg.key()
        try:
            event = parse(value, key, max_bytes=self.max_bytes, tables=self.tables)
        except EnvelopeError as exc:
            self.dead_letters.write_error(exc, msg)
            self.stats.dead_lettered += 1
            self.stats.by_code[exc.code] = self.stats.by_code.get(exc.code, 0) + 1
            return None
        if event is None:
            self.stats.tombstones += 1
            return None
        self.stats.good += 1
        ts_type, ts = msg.timestamp()
        return Consumed(event, topic, part, off, key, ts if ts_type else None)

    def poll(self, timeout: float = 1.0, max_messages: int = 500) -> list[Consumed]:
        """Good events of up to ``max_messages`` messages, waiting up to ``timeout``."""
        # poll() returns on the first message; consume() would wait out its timeout
        # whenever fewer than max_messages are available.
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        msgs = [first, *self._consumer.consume(max_messages - 1, 0)] if max_messages > 1 \
            else [first]
        out: list[Consumed] = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise CdcError(f"consuming {self.topic!r}: {err}", topic=self.topic)
            got = self._handle(msg)
            if got is not None:
                out.append(got)
        return out

    def events(self, *, idle_timeout: float | None = None,
               poll_timeout: float = 0.5) -> Iterator[Consumed]:
        """Yield good events; stop after ``idle_timeout`` seconds without a message."""
        last = time.monotonic()
        while True:
            batch = self.poll(poll_timeout)
            if batch:
                last = time.monotonic()
                yield from batch
            elif idle_timeout is not None and time.monotonic() - last >= idle_timeout:
                return

    def commit(self) -> None:
        """Flush dead letters, then commit the offsets of every message returned.

        :raises CdcError: a dead letter was not written (offsets not committed).
        """
        self.dead_letters.flush()
        if self._grouped and self._pending:
            self._consumer.commit(offsets=[TopicPartition(t, p, o)
                                           for (t, p), o in self._pending.items()],
                                  asynchronous=False)
        self._pending.clear()

    def close(self) -> None:
        try:
            self.dead_letters.flush()
        finally:
            self._consumer.close()

    def __enter__(self) -> ChangeConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_all(bootstrap: str, topic: str, *, timeout: float = 10.0, expect: int | None = None,
             idle: float = 1.0, partitions: Sequence[int] | None = None) -> list[KafkaMessage]:
    """Every message of ``topic`` from the beginning, all partitions, no group.

    Returns once ``expect`` messages arrived, or ``idle`` seconds passed without
    one (after at least one arrived or ``timeout`` expired).
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "wakeline-read-all",
                         "enable.auto.commit": False, "log_level": 3})
    out: list[KafkaMessage] = []
    try:
        _assign_all(consumer, topic, OFFSET_BEGINNING, partitions, timeout)
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < deadline:
            if expect is not None and len(out) >= expect:
                break
            msg = consumer.poll(0.2)
            if msg is None:
                if out and expect is None and time.monotonic() - last >= idle:
                    break
                continue
            if msg.error() is not None:
                continue
            out.append(msg)
            last = time.monotonic()
    finally:
        consumer.close()
    return out
