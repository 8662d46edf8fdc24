"""The conditions agent's producer is connected before the worker says it is ready
(wakeline.cdc._kafka.warm_producer; the readiness stage warms its own the same way).

Created on first use, its first batch's job flush waited ~0.5 s (Tansu and Apache
Kafka, bench/stream_throughput.py) for the connection, the idempotent producer's id
and the derive topic's metadata: the first jobs of a fresh worker were that late."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest

from tests.fixtures.streaming import _topology
from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.catalog import compile_catalog
from wakeline.streams.app import Runtime, _after_reload
from wakeline.topology import load_topology

pytestmark = pytest.mark.integration


def _runtime(tmp_path, bootstrap: str) -> Runtime:
    root = catalog_dir(tmp_path, {"w": derivation("w", "write: {}")})
    topo = load_topology(_topology(tmp_path, f"t{uuid.uuid4().hex[:10]}", 2, "relay"))
    return Runtime(topo, compile_catalog(root), "postgresql://unused", bootstrap,
                   roles=("conditions",))


def test_the_reload_connects_the_producer_before_the_ready_line(tansu_broker, tmp_path):
    rt = _runtime(tmp_path, tansu_broker.bootstrap)
    try:
        assert rt._producer is None
        asyncio.run(_after_reload(rt, [], set(), time.monotonic()))
        assert rt._warmed and rt._producer is not None
        t0 = time.monotonic()
        rt.producer.produce(rt.topology.topics.derive.name, b"{}", b"k")
        assert rt.producer.flush(10) == 0
        first_flush = time.monotonic() - t0
        assert first_flush < 0.25, f"the first flush still waited {first_flush:.3f} s"
    finally:
        rt.close()


def test_a_broker_not_answering_yet_is_left_to_the_first_batch(tmp_path, caplog):
    rt = _runtime(tmp_path, "127.0.0.1:1")
    try:
        with caplog.at_level(logging.WARNING, logger="wakeline.kafka"):
            rt.warm_producer(timeout=0.5)
        assert not rt._warmed
        assert "a producer could not reach the broker yet" in caplog.text
    finally:
        rt.close()


def test_the_readiness_stage_warms_its_producer_before_it_subscribes(tansu_broker, tmp_path,
                                                                     monkeypatch):
    import threading

    from wakeline.cdc import _kafka
    from wakeline.streams.readiness import Enricher, ReadinessConsumer

    warmed: list[tuple[tuple[str, ...], bool]] = []
    real = _kafka.warm_producer
    stop = threading.Event()

    def watched(producer, topics, timeout=10.0):
        ok = real(producer, topics, timeout)
        warmed.append((tuple(topics), ok))
        stop.set()  # the session ends before its first poll
        return ok

    monkeypatch.setattr(_kafka, "warm_producer", watched)
    name = f"t{uuid.uuid4().hex[:10]}"
    cat = compile_catalog(catalog_dir(tmp_path, {"w": derivation("w", "write: {}")}))
    rc = ReadinessConsumer(Enricher(cat, None), bootstrap=tansu_broker.bootstrap,  # type: ignore[arg-type]
                           topic=f"{name}.changes", ready_topic=f"{name}.ready",
                           dead_letter_topic=f"{name}.dlq", group=f"{name}-readiness",
                           stop=stop, on_outcome=lambda o: None)
    rc.start()
    try:
        rc.join(30)
        assert warmed == [((f"{name}.ready",), True)]
        assert not rc.is_alive()
    finally:
        stop.set()
        rc.join(10)
