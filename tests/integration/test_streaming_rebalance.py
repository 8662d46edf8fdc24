"""Two workers (readiness, conditions and derive) with a rebalance mid-stream lose and
duplicate nothing (Apache Kafka 4.x, the relay; checked against the runs table)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.fixtures.streaming import make_stack
from tests.unit.core.helpers import catalog_dir, derivation

pytestmark = pytest.mark.integration

ENTITIES = 60


def topic_messages(st, entity: str) -> list[tuple[int, int, str]]:
    """(partition, offset, value head) of the entity's messages on the changes topic."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    name = st.app_id.removeprefix("wl-") + ".changes"
    c = Consumer({"bootstrap.servers": st.bootstrap, "group.id": f"dbg-{uuid.uuid4().hex}",
                  "enable.auto.commit": False})
    try:
        md = c.list_topics(name, timeout=10).topics[name]
        out = []
        for p in md.partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(name, p), timeout=10)
            c.assign([TopicPartition(name, p, lo)])
            n = lo
            while n < hi:
                m = c.poll(5)
                if m is None:
                    break
                n = m.offset() + 1
                if m.error() is None and entity.encode() in (m.key() or b""):
                    v = (m.value() or b"").decode("utf-8", "replace")
                    seq = re.search(r'"seq":\s*(\d+)', v)
                    table = re.search(r'"table":\s*"(\w+)"', v)
                    out.append((p, m.offset(), f"{table and table[1]} seq={seq and seq[1]}"))
        return out
    finally:
        c.close()


def check_exactly_once(st, expected: dict[str, int]) -> None:
    """Every record consumed exactly once per entity: contiguous, non-overlapping runs."""
    runs = [r for r in st.runs("w") if r["outcome"] in ("succeeded", "noop")]
    by_entity: dict[str, list[dict]] = {}
    for r in runs:
        by_entity.setdefault(r["entity"], []).append(r)
    missing = [e for e in expected if e not in by_entity]
    assert not missing, f"entities never run: {missing[:5]}"
    short = {e: (sum(r["records_consumed"] for r in rs), expected[e])
             for e, rs in by_entity.items()
             if sum(r["records_consumed"] for r in rs) != expected[e]}
    seen: dict[str, dict[int, tuple[int, int]]] = {}  # worker -> partition -> (first, last)
    for i, w in enumerate(st.workers):
        for line in w.lines:
            parts = line.split("wakeline-trace", 1)[-1].split()
            if len(parts) > 4 and parts[1] == "event" and parts[2].endswith(".changes"):
                p, off = int(parts[3]), int(parts[4])
                lo, hi = seen.setdefault(f"w{i}", {}).get(p, (off, off))
                seen[f"w{i}"][p] = (min(lo, off), max(hi, off))
    if short:
        dump = Path("/tmp") / f"{st.app_id}-workers.log"
        dump.write_text("\n".join(f"w{i} {line}" for i, w in enumerate(st.workers)
                                  for line in w.lines))
        print(f"worker output: {dump}")
    for entity, rs in by_entity.items():
        rs.sort(key=lambda r: r["watermark_before"])
        consumed = sum(r["records_consumed"] for r in rs)
        assert consumed == expected[entity], (
            f"{entity}: consumed {consumed} of {expected[entity]}; all short: {short}\n"
            f"change offsets seen per worker and partition: {seen}\n"
            "group: " + "\n".join(f"w{i} {line}" for i, w in enumerate(st.workers)
                                  for line in w.lines
                                  if any(k in line for k in ("recovered", "revoked", "rebalance", "consumer ", "aiokafka ", "recovery ", "seeking back")))
            + f"\non the changes topic: {topic_messages(st, entity)}"
            + f"\nruns: {rs}\n"
            f"jobs: {st.query('SELECT * FROM jobs WHERE entity = %s ORDER BY created_at', entity)}"
            f"\noutcomes: {st.query('SELECT kind, reason, at FROM outcomes WHERE entity = %s', entity)}"
            f"\nrecords: {st.query('SELECT seq, enriched_at IS NOT NULL FROM records WHERE entity = %s ORDER BY seq', entity)}"
            + "\ntrace:\n" + "\n".join(f"w{i} {line}" for i, w in enumerate(st.workers)
                                        for line in w.lines if entity in line))
        for a, b in zip(rs, rs[1:]):
            assert b["watermark_before"] >= a["watermark_after"], ("overlap", entity, a, b)


def test_rebalance_mid_stream_loses_and_duplicates_nothing(pg_server, kafka_broker, tmp_path):
    root = catalog_dir(tmp_path, {"w": derivation("w", "write: {}", function="simfuncs:noop")})
    st = make_stack(pg_server, tmp_path, kafka_broker.bootstrap, root, partitions=4)
    try:
        a = st.worker("readiness", "conditions", "derive", relay=True)
        a.wait_for("conditions ready", timeout=90)
        expected: dict[str, int] = {}
        def burst(n: int) -> None:
            for i in range(n):
                e = f"user:{i % ENTITIES:03d}"
                st.write(e, type="chat", content={"i": i})
                expected[e] = expected.get(e, 0) + 1
        burst(ENTITIES * 2)
        st.wait_runs(ENTITIES // 2, derivation="w", timeout=60)
        # joins: partitions of every role move mid-stream
        b = st.worker("readiness", "conditions", "derive")
        burst(ENTITIES * 2)
        b.wait_for("conditions ready", timeout=90)
        burst(ENTITIES * 2)
        time.sleep(2)
        b.stop()                               # leaves: its partitions come back to a
        burst(ENTITIES)
        total = sum(expected.values())
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            done = sum(r["records_consumed"] for r in st.runs("w"))
            if done >= total:
                break
            time.sleep(0.25)
        time.sleep(2)
        check_exactly_once(st, expected)
        assert any("conditions ready" in line for line in b.lines)
        assert any(re.search(r"derive ready, partitions \[\d", line) for line in b.lines)
        # ready partition p and stimuli partition p were always on one worker
        assert not [line for w in st.workers for line in w.lines
                    if "not co-partitioned" in line]
    finally:
        st.stop()
        st.store.close()
