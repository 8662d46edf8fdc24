"""Malformed change messages go to the dead-letter topic; the stream goes on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.unit.cdc import samples
from wakeline.cdc import ChangeConsumer, ReadyRecord, UnreadyInsert
from wakeline.cdc._kafka import ensure_topic
from wakeline.cdc.dlq import read_dead_letters

pytestmark = pytest.mark.integration


def _msg(op: str, table: str, pred: Any = None) -> tuple[bytes, bytes]:
    m = samples.find(op, table, pred)
    return m["key"].encode(), m["value"].encode()


def _edit(value: bytes, fn: Any) -> bytes:
    doc = json.loads(value)
    fn(doc)
    return json.dumps(doc).encode()


def test_bad_messages_are_dead_lettered_and_good_ones_flow(
        kafka_broker: Any, topic_name: str, group_id: str) -> None:
    bootstrap = kafka_broker.bootstrap
    ensure_topic(bootstrap, topic_name, 1)
    good1 = _msg("c", "records", lambda v: v["after"]["type"] == "chat")
    good2 = _msg("u", "records", lambda v: v["after"]["type"] == "chat"
                 and v["before"]["enriched_at"] is None)
    good3 = _msg("c", "records", lambda v: v["after"]["tombstone"])
    big = _msg("c", "records", lambda v: "big" in v["after"]["content"])
    key = good1[0]
    sent: list[tuple[bytes | None, bytes | None, str | None]] = [
        (*good1, None),
        (key, b"\x00\xff garbage \xfe", "cdc.envelope.not_json"),
        (key, good1[1][: len(good1[1]) // 2], "cdc.envelope.not_json"),
        (key, _edit(good1[1], lambda d: d["source"].update(table="jobs")),
         "cdc.envelope.unknown_table"),
        (key, _edit(good1[1], lambda d: d.update(op="x")), "cdc.envelope.unknown_op"),
        (*good2, None),
        (*big, "cdc.envelope.oversized"),
        (key, _edit(good1[1], lambda d: d.pop("after")), "cdc.envelope.missing_field"),
        (key, None, None),  # a Kafka tombstone: skipped, not an error
        (key, _edit(good1[1], lambda d: d["after"].update(content="{oops")),
         "cdc.envelope.bad_value"),
        (*good3, None),
    ]
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    for k, v, _ in sent:
        producer.produce(topic_name, v, k)
    assert producer.flush(30) == 0

    dlq = f"{topic_name}-dlq"
    ensure_topic(bootstrap, dlq, 1)
    limit = len(big[1]) - 1
    with ChangeConsumer(bootstrap, topic_name, group_id, dlq_topic=dlq, max_bytes=limit) as cc:
        got = list(cc.events(idle_timeout=2))
        cc.commit()
        stats = cc.stats
    assert [g.offset for g in got] == [i for i, (_, _, bad) in enumerate(sent)
                                       if bad is None and sent[i][1] is not None]
    assert [type(g.event) for g in got] == [UnreadyInsert, ReadyRecord, ReadyRecord]
    assert got[2].event.tombstone  # type: ignore[union-attr]
    assert (stats.good, stats.dead_lettered, stats.tombstones) == (3, 7, 1)

    letters = read_dead_letters(bootstrap, dlq, expect=7, timeout=30)
    expected = [(i, v, bad) for i, (_, v, bad) in enumerate(sent) if bad is not None]
    assert [(d.offset, d.value, d.code) for d in letters] == expected
    for d in letters:
        assert d.topic == topic_name and d.partition == 0
        assert d.key is not None and d.reason and not d.truncated
        assert d.size == len(d.value or b"") and d.at and d.timestamp_ms
    oversized = next(d for d in letters if d.code == "cdc.envelope.oversized")
    assert str(limit) in oversized.reason

    # The offsets were committed: the same group sees nothing again.
    with ChangeConsumer(bootstrap, topic_name, group_id, dlq_topic=dlq) as again:
        assert list(again.events(idle_timeout=1.5)) == []
