"""When no conditions agent answers: the API still answers at once, and what it sent
is durable — a worker started later applies the pending requests and answers them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from pydantic import SecretStr

from tests.fixtures.streaming import make_stack
from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.api import ApiContext, ApiServer, ApiSettings
from wakeline.catalog import compile_catalog
from wakeline.cdc._kafka import ensure_topic
from wakeline.topology import load_topology

pytestmark = pytest.mark.integration

MOOD = {"mood_v1": {"valence": 0.0, "label": "calm"}}


def _stimuli(bootstrap: str, topic: str, partitions: int) -> list[dict[str, Any]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fallback-probe",
                  "enable.auto.commit": False, "log_level": 3})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[dict[str, Any]] = []
    idle_until = time.monotonic() + 3
    while time.monotonic() < idle_until:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            out.append(json.loads(m.value()))
            idle_until = time.monotonic() + 1
    c.close()
    return out


def test_without_an_agent_reads_answer_from_postgresql_and_requests_wait_in_the_log(
        pg_server: Any, tansu_broker: Any, tmp_path: Path) -> None:
    cat = catalog_dir(tmp_path, {"profile": derivation(
        "profile", "read: true", source="collections: [main]\n  types: [chat]",
        function="simfuncs:echo_profile", emits="[profiles]")})
    st = make_stack(pg_server, tmp_path, tansu_broker.bootstrap, cat)
    topo = load_topology(st.topology)
    # No worker yet, so nobody created the stimuli topic: create it as a worker would.
    ensure_topic(st.bootstrap, topo.topics.stimuli.name, topo.topics.stimuli.partitions)
    ctx = ApiContext(topo, compile_catalog(cat), st.dsn, st.bootstrap, app_id=st.app_id,
                     settings=ApiSettings(tokens={"default": SecretStr("t")},
                                          reply_timeout_s=0.3, manual_timeout_s=0.3))
    server = ApiServer(ctx, port=0).start()
    c = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer t"}, timeout=30)
    try:
        seq = c.post("/records", json={"entity": "user:kim", "collection": "main",
                                       "type": "chat", "ready": True, "annotations": MOOD,
                                       "content": {"set": "role", "value": "pilot"}}).json()["seq"]
        t0 = time.monotonic()
        r = c.get("/document", params={"entity": "user:kim", "max_staleness": 60})
        assert r.status_code == 200 and time.monotonic() - t0 < 5
        doc = r.json()
        assert doc["freshness_source"] == "store" and doc["request_id"]
        assert doc["freshness"] == [{"derivation": "profile", "last_run_at": None,
                                     "watermark": 0, "dirty": True, "pending_unready": False,
                                     "job": "enqueued", "error_kind": None}]
        m = c.post("/processors/profile/run", json={"entity": "user:kim"})
        assert m.status_code == 202, m.text
        pending = m.json()
        assert pending["status"] == "pending" and pending["job_id"] is None
        rid = pending["request_id"]
        assert c.get(f"/requests/{rid}").status_code == 404
        sent = _stimuli(st.bootstrap, topo.topics.stimuli.name, topo.topics.stimuli.partitions)
        assert {(s["type"], s["request_id"]) for s in sent} == {("read", doc["request_id"]),
                                                                ("manual", rid)}

        # A worker starts: it applies both requests from the log and answers them.
        worker = st.worker(relay=True)
        worker.wait_for("conditions ready", timeout=90)
        deadline = time.monotonic() + 60
        while c.get(f"/requests/{rid}").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        answer = c.get(f"/requests/{rid}").json()
        assert answer["kind"] == "manual" and answer["reply"]["job"]["job_id"]
        runs = st.wait_runs(1, derivation="profile", entity="user:kim")
        assert runs and seq <= runs[0]["watermark_after"]
        assert set(runs[0]["trigger_reasons"]) <= {"manual", "trigger:profile.default:read"}
    finally:
        c.close()
        server.stop()
        st.stop()
        st.store.close()
