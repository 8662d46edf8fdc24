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

:class:`ReadinessConsumer` runs the enricher in a worker process with the
readiness role. It reads the change topic in a consumer group of its own,
``<app id>-readiness``, so every partition is enriched once among all workers
with the role, whatever other roles they run. When readiness was a Faust agent
in the conditions group, a readiness-only worker and a conditions-only worker
split the change topic's partitions between them: each role saw half.
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
from wakeline.core.inputs import record_dict
from wakeline.core.outcomes import Outcome, OutcomeKind
from wakeline.core.plan import Rec
from wakeline.store import Store

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
    """The readiness role: the change topic in group ``<group>``, enriched in order.

    Offsets are committed after each batch is enriched (at least once; enriching
    twice is harmless, :meth:`Store.mark_ready` leaves ready records alone).
    Envelopes that do not parse are skipped here: the conditions agent
    dead-letters them."""

    def __init__(self, enricher: Enricher, *, bootstrap: str, topic: str, group: str,
                 stop: threading.Event, on_outcome: Callable[[Outcome], None],
                 announce: bool = False, batch: int = 500) -> None:
        super().__init__(name="readiness", daemon=True)
        self.enricher = enricher
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.stop_event, self.on_outcome = stop, on_outcome
        self.announce, self.batch = announce, batch
        self.enriched = 0
        self.assigned: set[int] = set()

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned |= {p.partition for p in partitions}
        if self.announce:
            print(f"wakeline: readiness ready, partitions {sorted(self.assigned)}", flush=True)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned -= {p.partition for p in partitions}

    def handle(self, key: bytes | None, value: bytes | None) -> bool:
        """Enrich one change event when it is an unready insert we cover."""
        from wakeline.cdc import envelope
        from wakeline.cdc.errors import EnvelopeError

        try:
            parsed = envelope.parse(value, key)
        except EnvelopeError:
            return False
        if not isinstance(parsed, envelope.UnreadyInsert):
            return False
        rec = parsed.record
        if not self.enricher.handles(rec.collection):
            return False
        outcome = self.enricher.enrich(parsed.workspace, parsed.entity, rec)
        if outcome is not None:
            self.on_outcome(outcome)
        self.enriched += 1
        return True

    def run(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": self.group,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
        })
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        try:
            while not self.stop_event.is_set():
                msgs = consumer.consume(self.batch, timeout=0.2)
                handled = False
                for m in msgs:
                    if m.error() is not None:
                        log.warning("readiness: %s", m.error())
                        continue
                    self.handle(m.key(), m.value())
                    handled = True
                if handled:
                    try:
                        consumer.commit(asynchronous=False)
                    except KafkaException as exc:  # a rebalance: the next owner re-enriches
                        log.warning("readiness: commit failed: %s", exc)
        finally:
            consumer.close()
