"""Cron in the stream: buckets planned once across all workers, scans paged durably.

``plan()`` (a 1 s timer on every cron worker) locks each cron trigger's row in
``cron_buckets`` and asks :func:`wakeline.core.cron.due_buckets` what to fire;
only the worker whose transaction advanced ``last_bucket`` sends the scan.  A
brand-new schedule starts at its latest due bucket; after downtime at most
``MAX_CRON_CATCHUP`` buckets fire (coalesced into one stimulus per entity) and
the rest are recorded as ``missed_cron`` outcomes.

A scan is a chain of page messages on the cron topic, 500 entities each in
lexical order; processing a page sends one ``cron`` stimulus per entity and then
the next page, so a restart resumes the scan where it stopped.  A page delivered
twice is harmless: the entity's state dedupes the bucket.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import psycopg

from wakeline.clock import iso
from wakeline.core.cron import MAX_CRON_CATCHUP, due_buckets
from wakeline.core.outcomes import Outcome, OutcomeKind
from wakeline.streams import stimuli
from wakeline.streams.keys import entity_key

PAGE = 500


class CronScheduler:
    def __init__(self, rt: Any, stimuli_topic: Any, cron_topic: Any,
                 max_catchup: int = MAX_CRON_CATCHUP) -> None:
        self.rt = rt
        self.stimuli_topic = stimuli_topic
        self.cron_topic = cron_topic
        self.max_catchup = max_catchup
        self.workspace = rt.topology.workspace
        self.crons = [(t, c) for t in rt.plan.triggers.values() for c in t.conds
                      if c.kind == "cron"]
        self._conn: psycopg.Connection[Any] | None = None

    def _db(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.rt.dsn, autocommit=True)
        return self._conn

    async def plan(self) -> None:
        if not self.crons:
            return
        loop = asyncio.get_running_loop()
        scans = await loop.run_in_executor(None, self._claim)
        for msg in scans:
            await self.cron_topic.send(key=msg["trigger"].encode(),
                                       value=json.dumps(msg).encode())

    def _claim(self) -> list[dict[str, Any]]:
        now = self.rt.clock.now()
        conn = self._db()
        scans = []
        for trig, cond in self.crons:
            with conn.transaction():
                conn.execute("INSERT INTO cron_buckets (workspace, trigger, last_bucket) "
                             "VALUES (%s, %s, 'epoch') ON CONFLICT DO NOTHING",
                             (self.workspace, trig.name))
                row = conn.execute("SELECT last_bucket FROM cron_buckets WHERE workspace = %s "
                                   "AND trigger = %s FOR UPDATE",
                                   (self.workspace, trig.name)).fetchone()
                last = row[0] if row and row[0] > datetime(1971, 1, 1, tzinfo=UTC) else None
                plan = due_buckets(cond.cron_expr, last, now, self.max_catchup)
                if plan.last_bucket is not None and plan.last_bucket != last:
                    # A new schedule records its starting bucket without firing it.
                    conn.execute("UPDATE cron_buckets SET last_bucket = %s, updated_at = %s "
                                 "WHERE workspace = %s AND trigger = %s",
                                 (plan.last_bucket, now, self.workspace, trig.name))
                if not plan.fire:
                    continue
            if plan.missed:
                self.rt.outcomes.put([Outcome(
                    OutcomeKind.MISSED_CRON,
                    f"bucket {iso(b)} skipped beyond the catch-up bound of {self.max_catchup}",
                    now, self.workspace, "", trig.derivation, trig.name, {"bucket": iso(b)})
                    for b in plan.missed])
            scans.append({"trigger": trig.name, "bucket": plan.fire[-1].timestamp(),
                          "catchup": [b.timestamp() for b in plan.fire[:-1]],
                          "after": "", "page": 0})
        return scans

    async def page(self, raw: bytes) -> None:
        msg = json.loads(raw)
        loop = asyncio.get_running_loop()
        entities = await loop.run_in_executor(None, self._entities, msg)
        for entity in entities:
            await self.stimuli_topic.send(
                key=entity_key(self.workspace, entity),
                value=stimuli.encode("cron", trigger=msg["trigger"], bucket=msg["bucket"],
                                     catchup=msg["catchup"]))
        if len(entities) == PAGE:
            nxt = {**msg, "after": entities[-1], "page": msg["page"] + 1}
            await self.cron_topic.send(key=msg["trigger"].encode(),
                                       value=json.dumps(nxt).encode())

    def _entities(self, msg: dict[str, Any]) -> list[str]:
        trig = self.rt.plan.triggers[msg["trigger"]]
        cond = next(c for c in trig.conds if c.kind == "cron")
        d = self.rt.plan.derivations[trig.derivation]
        conn = self._db()
        if cond.cron_entities == "any":
            rows = conn.execute(
                "SELECT DISTINCT entity FROM records WHERE workspace = %s AND entity > %s "
                "AND entity NOT LIKE '\\_system%%' ORDER BY entity LIMIT %s",
                (self.workspace, msg["after"], PAGE)).fetchall()
        else:
            names = sorted({n for n, _ in d.source.collections})
            rows = conn.execute(
                "SELECT DISTINCT r.entity FROM records r LEFT JOIN derivation_cursors c "
                "ON c.workspace = r.workspace AND c.derivation = %s AND c.entity = r.entity "
                "WHERE r.workspace = %s AND r.entity > %s AND r.collection = ANY(%s) "
                "AND r.enriched_at IS NOT NULL AND r.seq > coalesce(c.watermark, 0) "
                "AND r.entity NOT LIKE '\\_system%%' ORDER BY r.entity LIMIT %s",
                (d.name, self.workspace, msg["after"], names, PAGE)).fetchall()
        return [r[0] for r in rows]
