"""Kafka client settings shared by the relay, the dead-letter writer and the consumer."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from wakeline.cdc.errors import RelayError

#: Every entity on the partition a Java producer (Debezium) would pick, no
#: reordering on retries, and a fatal error instead of a gap.
PRODUCER_DEFAULTS: Mapping[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "enable.gapless.guarantee": True,
    "partitioner": "murmur2_random",
    "linger.ms": 1,
    "batch.num.messages": 10000,
    "queue.buffering.max.messages": 500000,
    "message.max.bytes": 16 * 1024 * 1024,
    "message.timeout.ms": 30000,
    "log_level": 3,
}


def producer_config(bootstrap: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, **PRODUCER_DEFAULTS, **(extra or {})}


def warm_producer(producer: Any, topics: Iterable[str], timeout: float = 10.0) -> bool:
    """Connect ``producer`` and read the metadata of the ``topics`` it will write, now:
    else its first flush waits for the connection, the idempotent producer's id and
    the topic's metadata (0.50 s on Tansu, 0.51-0.64 s on Apache Kafka 4.1:
    tests/integration/test_conditions_producer.py).  A broker that does not answer
    yet is logged and left to the first flush, which waits for it; returns whether
    it answered."""
    try:
        for topic in topics:
            producer.list_topics(topic, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - the first flush connects instead
        logging.getLogger("wakeline.kafka").warning(
            "a producer could not reach the broker yet: %r", exc)
        return False
    return True


def ensure_topic(bootstrap: str, topic: str, partitions: int, *, replication: int = 1,
                 timeout: float = 30.0, config: Mapping[str, str] | None = None) -> int:
    """Create ``topic`` unless it exists; return its partition count.

    An existing topic is left as it is (a different partition count is the
    operator's choice and is returned so callers can warn).  ``config``: topic
    settings such as ``cleanup.policy``.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    meta = admin.list_topics(timeout=timeout)
    existing = meta.topics.get(topic)
    if existing is not None and existing.error is None and existing.partitions:
        return len(existing.partitions)
    futures = admin.create_topics([NewTopic(topic, partitions, replication,
                                            config=dict(config or {}))],
                                  operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[topic].result(timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise RelayError(f"cannot create topic {topic!r}: {exc}", topic=topic) from exc
    # Metadata may lag the creation by a moment on some brokers.
    for _ in range(50):
        meta = admin.list_topics(topic, timeout=timeout)
        t = meta.topics.get(topic)
        if t is not None and t.error is None and t.partitions:
            return len(t.partitions)
        import time

        time.sleep(0.1)
    return partitions
