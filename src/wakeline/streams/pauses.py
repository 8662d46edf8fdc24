"""Operator pauses, durable in PostgreSQL and honoured by the conditions agent.

``trigger_pauses`` holds one row per (workspace, trigger): a reason, an optional
``until``, who paused it, and ``released_at`` once the pause is over.  The API
pauses by upserting the row and resumes by setting ``until`` to now; it never
deletes.  :class:`PauseSync` runs beside the conditions agent:

- every ``interval`` it loads the open pauses of the worker's workspace into
  ``Engine.paused`` (a paused trigger records a ``paused`` outcome instead of
  enqueueing, and its data stays pending above the watermark);
- it releases the pauses whose ``until`` has passed on the worker's clock, each
  claimed by one UPDATE so one worker does it once, and sends a ``reevaluate``
  stimulus to every entity that recorded a ``paused`` outcome for that trigger
  since it was paused — what the pause held back runs now, without waiting for
  that entity's next record.

The core keys pauses by trigger name, so a worker honours its topology's
workspace only.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

import psycopg
from confluent_kafka import Producer

from wakeline.streams import stimuli
from wakeline.streams.keys import entity_key

log = logging.getLogger("wakeline.streams.pauses")


def load_open(conn: psycopg.Connection[Any], workspace: str) -> dict[str, tuple[str, float | None]]:
    rows = conn.execute(
        "SELECT trigger, reason, until FROM trigger_pauses WHERE workspace = %s "
        "AND released_at IS NULL", (workspace,)).fetchall()
    return {t: (reason, until.timestamp() if until else None) for t, reason, until in rows}


def release_due(conn: psycopg.Connection[Any], workspace: str, now: datetime
                ) -> list[tuple[str, list[str]]]:
    """Claim the pauses whose ``until`` passed; return (trigger, held entities)."""
    with conn.transaction():
        rows = conn.execute(
            "UPDATE trigger_pauses SET released_at = %s WHERE workspace = %s "
            "AND released_at IS NULL AND until IS NOT NULL AND until <= %s "
            "RETURNING trigger, created_at", (now, workspace, now)).fetchall()
    out = []
    for trigger, since in rows:
        held = conn.execute(
            "SELECT DISTINCT entity FROM outcomes WHERE workspace = %s AND trigger = %s "
            "AND kind = 'paused' AND at >= %s AND entity IS NOT NULL ORDER BY entity",
            (workspace, trigger, since)).fetchall()
        out.append((str(trigger), [str(e) for (e,) in held]))
    return out


class PauseSync:
    """Keeps ``rt.engine.paused`` in step with ``trigger_pauses`` (a daemon thread)."""

    def __init__(self, rt: Any, stop: threading.Event, *, interval: float = 0.5) -> None:
        self.rt = rt
        self.stop = stop
        self.interval = interval
        self.released = 0
        self._thread = threading.Thread(target=self._loop, name="pauses", daemon=True)

    def start(self) -> PauseSync:
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def sync_once(self, conn: psycopg.Connection[Any], producer: Producer) -> None:
        rt = self.rt
        ws = rt.topology.workspace
        now = rt.clock.now()
        # Load first: a pause the API just ended (until = now) is already over for the
        # engine when the re-evaluations sent below arrive.  One reference swap: the
        # event loop reads whichever dict is current.
        rt.engine.paused = load_open(conn, ws)
        released = release_due(conn, ws, now)
        for trigger, entities in released:
            d = rt.plan.triggers[trigger].derivation if trigger in rt.plan.triggers else None
            for entity in entities:
                producer.produce(rt.topology.topics.stimuli.name, key=entity_key(ws, entity),
                                 value=stimuli.encode("reevaluate", derivation=d))
            producer.flush(30)
            self.released += 1
            log.info("pause of %s released: %d entities re-evaluated", trigger, len(entities))
        if released:
            rt.engine.paused = load_open(conn, ws)

    def _loop(self) -> None:
        producer = Producer({"bootstrap.servers": self.rt.bootstrap,
                             "partitioner": "murmur2_random", "log_level": 3,
                             "client.id": "wakeline-pauses"})
        conn: psycopg.Connection[Any] | None = None
        while not self.stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.rt.dsn, autocommit=True)
                self.sync_once(conn, producer)
            except Exception:  # the next round retries; pauses stay as last loaded
                log.exception("pause sync failed")
                conn = None
            self.stop.wait(self.interval)
        if conn is not None:
            conn.close()
