"""A read-only view of the conditions agents' per-entity state, tailed from the log.

The mailbox (queued jobs, settle deadlines, the next due timer) lives in the
conditions agent's entity store; its changelog topic
``<app_id>-wakeline-entity-state-changelog`` holds the latest state of every
entity as :func:`wakeline.core.codec.encode_state` bytes behind a small frame
(:mod:`wakeline.streams.statestore`; older workers wrote bare codec bytes or
JSON; all decode).  The value leaves the identity to the key.  This view
consumes that topic from the beginning in a daemon thread (no consumer group,
nothing committed) and keeps the latest bytes per entity, so the dashboard and
``GET /jobs/{id}`` can see queued jobs that PostgreSQL does not hold yet.

Memory is O(entities) in the API process; a deployment with millions of
entities would publish per-partition summaries from the agent instead.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from wakeline.core.codec import decode_state
from wakeline.core.state import EntityState
from wakeline.streams.keys import split_state_key, state_key
from wakeline.streams.statestore import unframe

log = logging.getLogger("wakeline.api.state")

TABLE = "wakeline-entity-state"


def changelog_topic(app_id: str) -> str:
    return f"{app_id}-{TABLE}-changelog"


class StateView:
    def __init__(self, bootstrap: str, app_id: str) -> None:
        self.bootstrap = bootstrap
        self.topic = changelog_topic(app_id)
        self._states: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self.messages = 0
        self.last_message_at: float | None = None
        self.assigned = 0

    def start(self) -> StateView:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="state-view", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _assign(self, consumer: Consumer) -> bool:
        md = consumer.list_topics(self.topic, timeout=5)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            self.error = (f"no changelog topic {self.topic!r} yet: is a conditions worker "
                          "running with this app id?")
            return False
        consumer.assign([TopicPartition(self.topic, p, 0) for p in sorted(t.partitions)])
        self.assigned = len(t.partitions)
        self.error = None
        return True

    def _loop(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "wakeline-api-view",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "session.timeout.ms": 6000, "log_level": 3})
        try:
            while not self._stop.is_set() and not self._assign(consumer):
                self._stop.wait(2.0)
            while not self._stop.is_set():
                msgs = consumer.consume(2000, 0.5)
                with self._lock:
                    for m in msgs:
                        err = m.error()
                        if err is not None:
                            if err.code() != KafkaError._PARTITION_EOF:
                                self.error = str(err)
                            continue
                        key = m.key()
                        if key is None:
                            continue
                        try:
                            skey = json.loads(key)
                        except ValueError:
                            skey = key.decode(errors="replace")
                        value = m.value()
                        if value is None:
                            self._states.pop(skey, None)
                        else:
                            self._states[skey] = value
                        self.messages += 1
                        self.last_message_at = time.time()
        except Exception as exc:  # the panel shows it; the API goes on
            log.exception("state view stopped")
            self.error = f"state view stopped: {exc}"
        finally:
            consumer.close()

    def states(self) -> Iterator[EntityState]:
        with self._lock:
            raw = list(self._states.items())
        for skey, data in raw:
            if not data or not isinstance(skey, str):
                continue
            try:
                yield decode_state(unframe(data)[0], *split_state_key(skey))
            except (ValueError, KeyError, TypeError):
                continue

    def state(self, workspace: str, entity: str) -> EntityState | None:
        with self._lock:
            data = self._states.get(state_key(workspace, entity))
        return decode_state(unframe(data)[0], workspace, entity) if data else None

    def __len__(self) -> int:
        return len(self._states)

    def find_job(self, job_id: str) -> tuple[EntityState, str, str, Any] | None:
        """(state, derivation, "queued"|"running", job) for a job the mailbox holds.

        Job ids read ``<workspace>/<derivation>/<entity>/<n>`` (the core makes
        them so): the entity's state is looked up directly."""
        parts = job_id.split("/")
        if len(parts) < 4:
            return None
        st = self.state(parts[0], "/".join(parts[2:-1]))
        if st is None:
            return None
        for name, ds in st.ds.items():
            for where, job in (("queued", ds.queued), ("running", ds.running)):
                if job is not None and job.id == job_id:
                    return st, name, where, job
        return None
