"""Roles split over processes: every change partition is enriched once and evaluated
once, whichever worker runs which role (Apache Kafka 4.x, the relay); workers without an
agent role do not join the conditions agents' group.

The bug this pins: the readiness agent was a Faust agent in the conditions agent's
consumer group, so a readiness-only worker took half of the change topic's
partitions from a conditions-only worker; records on those partitions were never
evaluated, and records on the other half were never enriched."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.streaming import make_stack
from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.topology import load_topology

pytestmark = pytest.mark.integration

ENTITIES = 24
ENRICH = ("def imp(record):\n    return 7.0\n\n\n"
          "def mood(record):\n    return {'valence': 0.1, 'label': 'calm'}\n")


def test_readiness_only_and_conditions_only_workers_cover_every_partition(
        pg_server, kafka_broker, tmp_path):
    root = catalog_dir(tmp_path, {"w": derivation("w", "write: {}")})
    main = (root / "collections" / "main.yaml").read_text()
    (root / "collections" / "main.yaml").write_text(main.replace(
        "scorers: [importance]", "scorers: [importance]\nenrichers: {importance: enrichfns:imp, "
        "mood_v1: enrichfns:mood}"))
    (root / "enrichfns.py").write_text(ENRICH)
    st = make_stack(pg_server, tmp_path, kafka_broker.bootstrap, root, partitions=4)
    try:
        cond = st.worker("conditions", "derive", relay=True)
        cond.wait_for("conditions ready", timeout=90)
        ready = st.worker("readiness")
        derive = st.worker("derive")
        ready.wait_for("readiness ready", timeout=90)
        derive.wait_for("derive ready", timeout=90)
        entities = [f"user:{i:03d}" for i in range(ENTITIES)]
        t_write = time.time()
        seqs = [st.write(e, type="chat", content={"i": i}, ready=False)
                for i, e in enumerate(entities)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = {r["entity"] for r in st.runs("w")}
            if done >= set(entities):
                break
            time.sleep(0.25)
        unready = st.query("SELECT entity FROM records WHERE seq = ANY(%s) "
                           "AND enriched_at IS NULL", seqs)
        assert not unready, f"never enriched: {sorted(e for (e,) in unready)}"
        never_run = sorted(set(entities) - {r["entity"] for r in st.runs("w")})
        assert not never_run, f"enriched but never evaluated: {never_run}"
        assert st.query("SELECT DISTINCT (scores->>'importance')::float FROM records "
                        "WHERE seq = ANY(%s)", seqs) == [(7.0,)]
        # every ready batch carries its newest change's broker time (the conditions
        # agent's measure of how far behind the change topic it is)
        sent = _ready_batch_times(kafka_broker.bootstrap,
                                  load_topology(st.topology).topics.ready.name)
        assert sent and all(t is not None and t_write - 5 <= t <= time.time() for t in sent), \
            (t_write, sent)
        # Workers without an agent role run no Faust app, so their starts and stops never
        # rebalance the conditions agents' group (each rebalance pauses the agents).
        for w in (ready, derive):
            w.stop()
            assert w.proc.returncode == 0, "\n".join(w.lines[-30:])
        time.sleep(2.0)
        rebalances = [line for line in cond.lines if "rebalance complete" in line]
        assert len(rebalances) == 1, "\n".join(cond.lines[-40:])
    finally:
        st.stop()
        st.store.close()


def _ready_batch_times(bootstrap: str, topic: str) -> list[float | None]:
    from confluent_kafka import Consumer

    from wakeline.streams import ready

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{time.time_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[float | None] = []
    idle = time.monotonic() + 10
    try:
        while time.monotonic() < idle:
            m = c.poll(0.5)
            if m is None:
                if out:
                    break
                continue
            if m.error() is None:
                out.append(ready.decode(m.value())[2])
    finally:
        c.close()
    return out
