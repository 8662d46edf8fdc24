"""Readiness / enrichment: make unready records ready by running the catalog's enrichers.

For a record inserted unready into a collection whose ``enrichers:`` cover every
scorer and every required annotator, the readiness agent computes them and marks
the record ready in ONE UPDATE (annotations, scores and ``enriched_at``).  That
update is a committed change like any other, so the record reaches the
conditions agent through the change topic — the readiness gate is PostgreSQL's,
never the agent's memory.  Collections whose enrichment is incomplete are left
to an external enricher.  A failing enricher is retried with backoff; after the
budget it is a recorded ``enrichment_failed`` outcome, and the core's
``unready_stalled`` outcome says the record blocks its watermark.

:class:`ReadinessConsumer` is the readiness role: the stage between the change
topic and the conditions agents (DESIGN.md's "readiness / enrichment agent ->
ready records").  It reads the change topic in a consumer group of its own,
``<app id>-readiness``, so every partition is handled once among all workers
with the role, whatever other roles they run (when readiness was a Faust agent
in the conditions group, a readiness-only and a conditions-only worker split the
change partitions between them: each role saw half).  It parses every envelope,
dead-letters what does not parse, runs the enrichers, and forwards the core's
events in ready batches (:mod:`wakeline.streams.ready`): the conditions agents
read those, so a deployment runs the readiness role somewhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from wakeline.catalog import Catalog
from wakeline.catalog._functions import resolve_callable
from wakeline.cdc import envelope
from wakeline.cdc.errors import EnvelopeError
from wakeline.core.inputs import record_dict
from wakeline.core.outcomes import Outcome, OutcomeKind
from wakeline.core.plan import Rec
from wakeline.store import Store
from wakeline.streams.gcpolicy import collect_between_batches
from wakeline.streams.keys import parse_key
from wakeline.streams.ready import Handoff, Item

log = logging.getLogger("wakeline.streams.readiness")


class Enricher:
    def __init__(self, catalog: Catalog, store: Store, *, attempts: int = 3,
                 backoff: float = 0.5) -> None:
        self.store = store
        self.attempts = attempts
        self.backoff = backoff
        self.plans: dict[str, list[tuple[str, str, Callable[..., Any]]]] = {}
        for name, coll in catalog.collections.items():
            needed = set(coll.scorers) | {a for a, d in coll.annotators.items() if d.required}
            if not coll.enrichers or not needed <= set(coll.enrichers):
                continue
            steps = []
            for what, ref in sorted(coll.enrichers.items()):
                kind = "scorer" if what in coll.scorers else "annotator"
                steps.append((what, kind, resolve_callable(catalog.root, ref)))
            self.plans[name] = steps

    def handles(self, collection: str) -> bool:
        return collection in self.plans

    def enrich(self, workspace: str, entity: str, rec: Rec) -> Outcome | None:
        """Compute and mark ready; an Outcome when it could not (after retries)."""
        row = record_dict(rec)
        error: Exception | None = None
        for attempt in range(1, self.attempts + 1):
            scores: dict[str, Any] = {}
            annotations: dict[str, Any] = {}
            try:
                for what, kind, fn in self.plans[rec.collection]:
                    value = fn(row)
                    (scores if kind == "scorer" else annotations)[what] = value
            except Exception as exc:  # an enricher's failure is a recorded outcome
                error = exc
                time.sleep(self.backoff * 2 ** (attempt - 1))
                continue
            self.store.mark_ready([rec.seq], scores={rec.seq: scores},
                                  annotations={rec.seq: annotations})
            return None
        return Outcome(OutcomeKind.ENRICHMENT_FAILED,
                       f"enrichment of seq {rec.seq} failed after {self.attempts} attempts: "
                       f"{type(error).__name__}: {error}", datetime.now(UTC), workspace, entity,
                       None, None, {"seq": rec.seq, "collection": rec.collection})


class ReadinessConsumer(threading.Thread):
    """The readiness stage: the change topic in group ``<app id>-readiness``, forwarded
    as ready batches (:mod:`wakeline.streams.ready`) to the conditions agents.

    Each message is parsed once, here: an envelope that does not parse is
    dead-lettered (original bytes, the reason in headers, a ``dead_letter``
    outcome) and the stream goes on; an unready insert of a collection the catalog
    enriches is enriched.  The core's events of each partition's messages go out
    as batches on the same partition of the ready topic.  Offsets are committed
    only after the broker took the batches and the dead letters (at least once: a
    range forwarded twice after a failover is skipped by the agents).
    """

    def __init__(self, enricher: Enricher, *, bootstrap: str, topic: str, ready_topic: str,
                 dead_letter_topic: str, group: str, stop: threading.Event,
                 on_outcome: Callable[[Outcome], None], announce: bool = False,
                 batch: int = 5000, handoff: Handoff | None = None,
                 start_after: threading.Event | None = None,
                 start_after_s: float = 30.0) -> None:
        super().__init__(name="readiness", daemon=True)
        self.enricher = enricher
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.ready_topic, self.dead_letter_topic = ready_topic, dead_letter_topic
        self.stop_event, self.on_outcome = stop, on_outcome
        self.announce, self.batch = announce, batch
        #: the conditions agent of this process, when it runs one: the batches of the
        #: partitions it reads are handed over decoded (ready.Handoff)
        self.handoff = handoff
        #: the conditions agent of this process has its first assignment: until then (at
        #: most ``start_after_s``) nothing is read, so a starting worker does not parse a
        #: backlog ahead of its own agent (which it would hand over decoded for nothing)
        self.start_after, self.start_after_s = start_after, start_after_s
        self.consumed = 0
        self.forwarded = 0  # change messages whose events went out in a batch
        self.batches = 0
        self.enriched = 0
        self.dead_letters = 0
        self.failures = 0
        self.assigned: set[int] = set()

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned |= {p.partition for p in partitions}
        if self.announce:
            print(f"wakeline: readiness ready, partitions {sorted(self.assigned)}", flush=True)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned -= {p.partition for p in partitions}

    def handle(self, msg: Any, dlq: Any, commits: dict[int, int] | None = None) -> Item | None:
        """The ready item of one change message: None when it carries nothing for the
        core (a transaction marker, a Kafka tombstone) or was dead-lettered.
        ``commits``: per partition, the newest commit time (ms, ``source.ts_us``) seen,
        updated with this message's."""
        key, value = msg.key(), msg.value()
        try:
            parsed = envelope.parse(value, key)
        except EnvelopeError as exc:
            dlq.write_error(exc, msg)
            self.dead_letters += 1
            ident = parse_key(key) or ("", "")
            self.on_outcome(Outcome(
                OutcomeKind.DEAD_LETTER, f"{exc.code}: {exc}", datetime.now(UTC), ident[0],
                ident[1], None, None,
                {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset()}))
            return None
        if parsed is None or isinstance(parsed, envelope.TransactionMarker):
            return None
        ts_us = parsed.source.ts_us
        if commits is not None and ts_us is not None:
            p, ms = msg.partition(), ts_us // 1000
            if ms > commits.get(p, -1):
                commits[p] = ms
        if isinstance(parsed, envelope.CursorAdvance):
            adv = parsed.cursor_advanced()
            if adv is None:
                return None
            events: list[Any] = [adv]
        else:
            if isinstance(parsed, envelope.UnreadyInsert) and \
                    self.enricher.handles(parsed.record.collection):
                outcome = self.enricher.enrich(parsed.workspace, parsed.entity, parsed.record)
                if outcome is not None:
                    self.on_outcome(outcome)
                self.enriched += 1
            events = [parsed.record_changed()]
        return Item(key or b"", parsed.workspace, parsed.entity, msg.offset(), events)

    def run(self) -> None:
        if self.start_after is not None:
            deadline = time.monotonic() + self.start_after_s
            while not self.start_after.wait(0.1) and not self.stop_event.is_set() \
                    and time.monotonic() < deadline:
                pass
        backoff = 0.5
        while not self.stop_event.is_set():
            try:
                self._session()
                return
            except Exception:  # noqa: BLE001 - a broker outage: start again from the commit
                self.failures += 1
                log.exception("readiness: restarting from the committed offsets in %.1f s",
                              backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _session(self) -> None:
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, Producer, TopicPartition

        from wakeline.cdc._kafka import producer_config, warm_producer
        from wakeline.cdc.dlq import DeadLetterWriter
        from wakeline.streams import ready

        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": self.group,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "log_level": 3,
            "fetch.wait.max.ms": 50, "client.id": "wakeline-readiness",
        })
        producer = Producer(producer_config(self.bootstrap, {
            "linger.ms": 0, "client.id": "wakeline-readiness"}))
        warm_producer(producer, (self.ready_topic,))  # else the first batch waits ~0.5 s
        dlq = DeadLetterWriter(topic=self.dead_letter_topic, producer=producer)
        failed: list[Any] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(err)

        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        try:
            while not self.stop_event.is_set():
                first = consumer.poll(0.2)
                if first is None:
                    continue
                msgs = [first, *consumer.consume(self.batch - 1, 0)]
                parts: dict[int, tuple[list[ready.Item], list[int]]] = {}
                last: dict[int, int] = {}
                sent: dict[int, int] = {}  # per partition, its newest broker timestamp (ms)
                commits: dict[int, int] = {}  # per partition, its newest commit time (ms)
                for m in msgs:
                    if m.error() is not None:
                        log.warning("readiness: %s", m.error())
                        continue
                    p = m.partition()
                    last[p] = m.offset()
                    kind, ts = m.timestamp()
                    if kind != TIMESTAMP_NOT_AVAILABLE and ts > sent.get(p, -1):
                        sent[p] = ts
                    item = self.handle(m, dlq, commits)
                    if item is not None:
                        items, sizes = parts.setdefault(p, ([], []))
                        items.append(item)
                        sizes.append(len(m.value() or b""))
                self.consumed += len(msgs)
                handoff = self.handoff
                for p, (items, sizes) in parts.items():
                    for chunk in ready.chunks(items, sizes):
                        t = commits.get(p, sent.get(p))
                        value = ready.encode(p, chunk, t)
                        if handoff is not None and handoff.wants(p):
                            # kept before it is produced: the agent cannot read it first
                            handoff.put(value, p, list(chunk), t)
                        producer.produce(self.ready_topic, value, partition=p,
                                         on_delivery=delivered)
                        self.batches += 1
                    self.forwarded += len(items)
                dlq.flush()  # waits for the batches too: one producer
                if failed:
                    raise RuntimeError(f"ready topic {self.ready_topic!r} refused a batch: "
                                       f"{failed[0]}")
                if last:
                    consumer.commit(offsets=[TopicPartition(self.topic, p, o + 1)
                                             for p, o in last.items()], asynchronous=True)
                collect_between_batches("readiness")
        finally:
            consumer.close()
            producer.flush(10)
