"""A resync reads its entities' cursor rows from PostgreSQL in one query per batch, and
turns each row whose job is the entity's running one, and has ended, into the run's end;
after a takeover the resync stimuli reach each entity's own stimuli partition; end to
end, a run that ended while no worker held its entity frees the mailbox of the worker that
takes it over."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from types import SimpleNamespace

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.fixtures.streaming import make_stack
from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.cdc._kafka import ensure_topic, producer_config
from wakeline.cdc.partitioner import partition_for
from wakeline.core.events import CursorAdvanced
from wakeline.core.state import EntityState, Job
from wakeline.store import migrate
from wakeline.streams import stimuli
from wakeline.streams.app import send_resyncs
from wakeline.streams.batch import cursor_rows, finished_runs
from wakeline.streams.keys import entity_key

pytestmark = pytest.mark.integration

AT = datetime(2026, 7, 19, 9, 0, tzinfo=UTC)


def _cursors(dsn: str, rows: list[tuple[str, str, str, int, str | None, str | None]]) -> None:
    with psycopg.connect(dsn) as conn:
        for workspace, derivation, entity, watermark, outcome, job_id in rows:
            conn.execute(
                "INSERT INTO derivation_cursors (workspace, derivation, entity, watermark, "
                "last_run_at, last_outcome, last_job_id) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (workspace, derivation, entity, watermark, AT if outcome else None, outcome,
                 job_id))


def test_cursor_rows_of_many_entities_in_one_read(pg_dsn: str) -> None:
    migrate(pg_dsn)
    _cursors(pg_dsn, [
        ("w1", "d", "a", 7, "succeeded", "j-a"),
        ("w1", "e", "a", 3, "failed", "j-a2"),
        ("w2", "d", "a", 9, "succeeded", "j-other-workspace"),
        ("w1", "d", "b", 2, None, None),
        ("w1", "d", "c", 5, "succeeded", "j-c"),  # not asked for
    ])
    got = cursor_rows(pg_dsn, [("w1", "a"), ("w1", "b"), ("w1", "missing")])
    assert {k: sorted(v) for k, v in got.items()} == {
        ("w1", "a"): [("d", 7, AT, "succeeded", "j-a"), ("e", 3, AT, "failed", "j-a2")],
        ("w1", "b"): [("d", 2, None, None, None)],
    }
    assert cursor_rows(pg_dsn, []) == {}


def test_only_the_running_jobs_that_ended_come_back_as_their_ends() -> None:
    st = EntityState("w1", "a")
    st.d("d").running = Job("j-a", {}, 0.0)
    st.d("e").running = Job("j-new", {}, 0.0)  # its row is an earlier job's end
    st.d("f").running = Job("j-f", {}, 0.0)  # its row has no end yet
    rows = [("d", 7, AT, "succeeded", "j-a"), ("e", 3, AT, "failed", "j-a2"),
            ("f", 1, None, None, "j-f"), ("g", 4, AT, "succeeded", "j-g")]  # g: not running
    assert finished_runs(st, rows) == [
        CursorAdvanced("d", 7, AT.timestamp(), "succeeded", "j-a")]
    assert finished_runs(EntityState("w1", "b"), [("d", 2, None, None, None)]) == []


def test_resyncs_after_a_takeover_reach_each_entitys_partition(tansu_broker) -> None:
    """The resyncs go out in one librdkafka batch, not one Faust send each: they must
    still land where every producer of the stimuli topic puts the entity's stimuli
    (the partition paired with its ready partition), and be on the broker before the
    worker says it is ready."""
    bootstrap = tansu_broker.bootstrap
    topic = f"resync-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, 4)
    keys = [entity_key("w1", f"user:{i:03d}") for i in range(40)]
    with ThreadPoolExecutor(2) as io:
        producer = Producer(producer_config(bootstrap))  # the agent's (Runtime.producer)
        asyncio.run(send_resyncs(SimpleNamespace(producer=producer, _io=io), topic, keys))
    got: dict[bytes, int] = {}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{topic}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(4)])
        deadline = time.monotonic() + 30
        while len(got) < len(keys) and time.monotonic() < deadline:
            m = c.poll(1)
            if m is None:
                continue
            assert m.error() is None
            assert isinstance(stimuli.decode(m.value()), stimuli.Resync)
            got[m.key()] = m.partition()
    finally:
        c.close()
    assert got == {k: partition_for(k, 4) for k in keys}
    assert len(set(got.values())) == 4


def _jobs_of(bootstrap: str, topic: str, entity: str, want: int, timeout: float = 30
             ) -> list[dict]:
    """The jobs for ``entity`` on the derive topic, read from its start until ``want`` were
    seen or ``timeout`` passed."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    got: list[dict] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                job = json.loads(m.value())
                if job["entity"] == entity:
                    got.append(job)
        return got
    finally:
        c.close()


def test_a_run_that_ended_while_no_worker_held_its_entity_frees_the_mailbox(
        pg_server, tansu_broker, tmp_path) -> None:
    """A worker takes over an entity whose stored state has a run in flight, and the
    run's end is in PostgreSQL but will never come through CDC (no relay runs here):
    only the resync after the reload can end it.  A manual run then dispatches a job at
    once; with the mailbox still holding the old run it would wait behind it."""
    root = catalog_dir(tmp_path, {"w": derivation("w", "write: {}")})
    st = make_stack(pg_server, tmp_path, tansu_broker.bootstrap, root, partitions=1)
    derive_topic = f"{st.app_id.removeprefix('wl-')}.derive"
    try:
        first = st.worker("readiness", "conditions", relay=True)
        first.wait_for("conditions ready", timeout=90)
        seq = st.write("user:1", type="chat", content={})
        [job] = _jobs_of(st.bootstrap, derive_topic, "user:1", 1)
        first.stop()  # graceful: its state (the run in flight) is on the changelog
        assert first.proc.returncode == 0
        with psycopg.connect(st.dsn) as conn:  # the run ended; no relay will tell anyone
            conn.execute(
                "INSERT INTO derivation_cursors (workspace, derivation, entity, watermark, "
                "last_run_at, last_outcome, last_job_id) VALUES ('default', 'w', 'user:1', "
                "%s, now(), 'succeeded', %s)", (seq, job["job_id"]))
        second = st.worker("conditions")
        second.wait_for("conditions ready", timeout=90)
        st.send_stimulus("user:1", "manual", derivation="w")
        jobs = _jobs_of(st.bootstrap, derive_topic, "user:1", 2)
        assert [j["job_id"] for j in jobs][:1] == [job["job_id"]]
        assert len(jobs) == 2 and jobs[1]["reasons"] == ["manual"], jobs
    finally:
        st.stop()
        st.store.close()
