"""The conditions agent's side of the API's request/reply.

A stimulus may carry ``request_id`` (the API's manual runs and reads do).  Once
the entity's mailbox has applied it, :func:`answer` records what the core said
in ``stimulus_replies`` — for ``manual``: the job id, whether it coalesced and
the effective run_after; for ``read``: the freshness entries of seed 000 and the
jobs the read enqueued or coalesced into.  The API polls that row for a moment
(:mod:`wakeline.api.mailbox`); it never waits for the run itself.

Writes go through a background thread so the stream never blocks on PostgreSQL;
a reply lost in a crash only makes the API fall back to its own answer, and the
stimulus itself is in the log either way.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from wakeline.clock import iso

log = logging.getLogger("wakeline.streams.replies")

_MARK = b'"request_id"'
KEEP_S = 86400.0
PRUNE_EVERY_S = 600.0


def request_id(raw: bytes | None) -> str | None:
    """The stimulus's ``request_id``, or None (ticks and CLI stimuli carry none)."""
    if not raw or _MARK not in raw:
        return None
    try:
        rid = json.loads(raw).get("request_id")
    except (ValueError, AttributeError):
        return None
    return str(rid) if rid else None


def _ts(t: float | None) -> str | None:
    return iso(datetime.fromtimestamp(t, UTC)) if t is not None else None


def reply_of(raw: bytes, step: Any) -> tuple[str, dict[str, Any], list[str]]:
    """(kind, reply, job ids) for the step that applied the stimulus ``raw``."""
    kind = str(json.loads(raw).get("type"))
    jobs = [{"derivation": m.derivation, "job_id": m.job_id, "coalesced": m.coalesced,
             "run_after": _ts(m.run_after)} for m in step.merged]
    reply: dict[str, Any] = {"jobs": jobs,
                             "outcomes": [o.to_dict() for o in step.outcomes],
                             "dispatched": [d.job_id for d in step.dispatched]}
    if step.job is not None:
        reply["job"] = {"job_id": step.job.job_id, "coalesced": step.job.coalesced,
                        "run_after": _ts(step.job.run_after),
                        "derivation": step.job.derivation}
    if kind == "read":
        reply["freshness"] = step.freshness
    return kind, reply, sorted({j["job_id"] for j in jobs})


class ReplyWriter:
    """Inserts replies from a queue in a daemon thread (one connection)."""

    def __init__(self, dsn: str, *, maxsize: int = 50_000) -> None:
        self.dsn = dsn
        self.dropped = 0
        self._q: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize)
        self._thread = threading.Thread(target=self._loop, name="replies", daemon=True)
        self._thread.start()

    def put(self, row: tuple[Any, ...]) -> None:
        try:
            self._q.put_nowait(row)
        except queue.Full:
            self.dropped += 1  # the API falls back to its own answer

    def _loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        pruned = 0.0
        while True:
            rows = [self._q.get()]
            while len(rows) < 500:
                try:
                    rows.append(self._q.get_nowait())
                except queue.Empty:
                    break
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True)
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO stimulus_replies (request_id, workspace, entity, kind, "
                        "reply, job_ids) VALUES (%s,%s,%s,%s,%s,%s) "
                        "ON CONFLICT (request_id) DO NOTHING",
                        [(r[0], r[1], r[2], r[3], Jsonb(r[4]), r[5]) for r in rows])
                    if time.monotonic() - pruned > PRUNE_EVERY_S:
                        # Replies serve a request for seconds; a day is plenty.
                        cur.execute("DELETE FROM stimulus_replies WHERE at < now() - %s",
                                    (timedelta(seconds=KEEP_S),))
                        pruned = time.monotonic()
            except psycopg.Error:
                log.exception("could not record %d API replies", len(rows))
                conn = None


def answer(rt: Any, raw: bytes, ident: tuple[str, str], step: Any) -> None:
    """Record the reply to ``raw`` if it asked for one (called by the conditions agent)."""
    rid = request_id(raw)
    if rid is None:
        return
    writer = getattr(rt, "_reply_writer", None)
    if writer is None:
        writer = ReplyWriter(rt.dsn)
        rt._reply_writer = writer
    kind, reply, job_ids = reply_of(raw, step)
    writer.put((rid, ident[0], ident[1], kind, reply, job_ids))
