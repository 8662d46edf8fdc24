"""The conditions agent's batch: messages in, each entity's events applied to its
state, jobs and states delivered (streams/delivery.py), outcomes handed to the writer.

Kept apart from the Faust app (streams/app.py) so that it can be compiled with the
rest of the hot path (wakeline/_compiled.py); it touches Faust only through the
events and the consumer it is given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from wakeline.core.engine import Dispatch
from wakeline.core.outcomes import Outcome
from wakeline.core.state import EntityState
from wakeline.derive import JobSpec
from wakeline.streams import ready, stimuli
from wakeline.streams.keys import parse_key, state_key
from wakeline.streams.tracing import TRACE, trace

if TYPE_CHECKING:
    from wakeline.streams.app import Runtime


def _parse_stimulus(event: Any) -> tuple[tuple[str, str] | None, list[Any], bool, str]:
    """(entity, core events, resync, error) of one stimuli message."""
    ident = parse_key(event.key)
    if ident is None:
        return None, [], False, "message key is not {workspace, entity}"
    try:
        decoded = stimuli.decode(event.value)
    except stimuli.BadStimulus as exc:
        return ident, [], False, str(exc)
    if isinstance(decoded, stimuli.Resync):
        return ident, [], True, ""
    return ident, [decoded], False, ""


#: most a partition's evaluation time is held behind the clock (seconds)
LAG_MAX = 60.0
#: a partition whose last batch was applied longer ago than this (real seconds) and
#: whose highwater shows nothing unread is idle: evaluated at ``now``
IDLE_S = 0.5
#: a partition whose batches are read less than this (real seconds) after their commit is
#: keeping up: evaluated at ``now`` (a lag of a few milliseconds is transport, and
#: would only stamp runs and queued jobs a hair before the clock)
LAG_MIN = 0.1


def event_times(app: Any, rt: Runtime, guard: Any, ready_name: str, now: float
                ) -> dict[int, float]:
    """Per ready partition still being read, the time its entities are evaluated at
    (dispatch, deadlines, ticks) instead of ``now``.

    A debounce deadline is the last relevant record's arrival + ``debounce_s``: "no
    record for N seconds".  A worker behind its input (a burst, a takeover) has not
    seen what arrived since; judged on the clock alone, that deadline has passed for
    every entity, and a job runs while the entity's next records sit unread
    (bench/burst.py: 1,128-1,256 runs for 1,000 entities, where ~1,000 is right).
    So, like a stream processor's event-time watermark, a partition with unread
    input is evaluated at ``now - lag``, where the lag is how long (real seconds,
    ``LAG_MIN`` to ``LAG_MAX``) before its last batch was read that batch's newest
    change had been committed in PostgreSQL (the CDC path's, the readiness stage's
    and this agent's backlogs together), and never before the latest arrival
    (``enriched_at``) read there nor after ``now``.  A partition read to its end is
    evaluated at ``now`` (absent from the result).

    Still being read: its highwater is past the next offset the agent expects, or
    it had a batch less than ``IDLE_S`` ago (Tansu reports a partition's end as its
    last record batch's base offset + 1, short of the real end, so the highwater
    alone misses a backlog there).  The lag is measured on the real clock (the
    change's commit time, ``source.ts_us``, or failing that its broker timestamp,
    carried in the ready batch), so an injected clock that jumps (tests) shifts
    nothing: a record read milliseconds after its commit is milliseconds behind."""
    consumer = app.consumer
    out: dict[int, float] = {}
    real = time.time()
    for tp in consumer.assignment():
        if tp.topic != ready_name:
            continue
        p = tp.partition
        behind = rt.behind.get(p)
        if behind is None or behind < LAG_MIN:
            continue
        if real - rt.read_at.get(p, 0.0) >= IDLE_S:
            want = guard.expected.get(tp)
            high = consumer.highwater(tp)
            if want is None or high is None or high <= want:
                continue
        t = max(now - min(LAG_MAX, behind), rt.seen_until.get(p, 0.0))
        if t < now:
            out[p] = t
    return out


async def handle_batch(app: Any, rt: Runtime, events: list[Any]) -> None:
    """Apply a batch of messages: each entity's events in order, its state read once
    and written (changelogged) once per batch; its jobs acknowledged by the broker
    and its states produced before the batch is acked (streams/delivery.py: the
    offsets are committed once the states are acknowledged too); outcomes handed
    over in one batch.
    Entities are independent, so grouping by entity keeps every order that matters."""
    topics = rt.topology.topics
    ready_name = topics.ready.name
    owned = {tp.partition for tp in app.consumer.assignment() if tp.topic == ready_name}
    c = rt.counters
    # entity -> [(partition, key, offset, core events, resync, stimulus message or None)];
    # the offset is the change message's for a ready item
    groups: dict[tuple[str, str], list[tuple[int, bytes, int, list[Any], bool, Any]]] = {}
    resyncs: set[tuple[str, str]] = set()  # entities with a resync stimulus in the batch
    stamps: dict[int, float] = {}  # per ready partition, its latest record arrival
    sent: dict[int, float] = {}  # per ready partition, its newest change's broker time
    for event in events:
        msg = event.message
        p = msg.partition
        if p not in owned:
            c.unowned += 1  # revoked meanwhile: the next owner has it
            continue
        if msg.topic == ready_name:
            try:
                bp, items, t = ready.decode(event.value, rt.handoff)
                if bp != p:
                    raise ready.BadBatch(f"a batch of partition {bp} on partition {p}")
            except ready.BadBatch as exc:
                await _dead_letter(rt, event, exc.code, str(exc))
                continue
            t = t or msg.timestamp  # its newest change's broker time, else its own
            if t and t > sent.get(p, 0.0):
                sent[p] = t
            seen = rt.applied.get(p, -1)
            latest = stamps.get(p, 0.0)
            for it in items:
                if it.offset <= seen:
                    c.replayed += 1
                    continue
                for e in it.events:
                    rec = getattr(e, "after", None)
                    if rec is not None and rec.enriched_at is not None \
                            and rec.enriched_at > latest:
                        latest = rec.enriched_at
                groups.setdefault((it.workspace, it.entity), []).append(
                    (p, it.key, it.offset, it.events, False, None))
            if latest:
                stamps[p] = latest
            if items:
                rt.applied[p] = max(seen, items[-1].offset)
        else:
            ident, core_events, resync, error = _parse_stimulus(event)
            if error:
                await _dead_letter(rt, event, "stimulus.invalid" if ident else "stream.bad_key",
                                   error)
                continue
            assert ident is not None
            groups.setdefault(ident, []).append(
                (p, event.key, msg.offset, core_events, resync, event))
            if resync:
                resyncs.add(ident)
    _seen(rt, stamps, sent)
    if not groups:
        return
    loop = asyncio.get_running_loop()
    for p in {item[0] for items in groups.values() for item in items}:
        pending = rt.store.loading(p, loop, rt._io)
        if pending is not None:
            await pending
    # Every resync of the batch reads its entities' cursor rows in one query.
    cursors = await loop.run_in_executor(rt._pool, cursor_rows, rt.dsn, sorted(resyncs)) \
        if resyncs else {}
    clock_now = rt.clock.now().timestamp()
    times = event_times(app, rt, rt.guards["conditions"], ready_name, clock_now)
    outcomes: list[Outcome] = []
    jobs: list[tuple[bytes, bytes]] = []
    for ident in list(groups):
        items = groups.pop(ident)  # so an entity's events are freed once applied
        skey = state_key(*ident)
        p = items[0][0]
        now = times.get(p, clock_now)  # event time while the partition is behind
        st = rt.store.get(p, skey, *ident)
        dispatched: list[Dispatch] = []
        for _, _key, offset, core_events, resync, stim in items:
            c.events += 1
            if resync:
                core_events = finished_runs(st, cursors.get(ident, ()))
            queue = list(core_events)
            step = None
            while queue:
                step = rt.engine.apply(st, queue.pop(0), now)
                st = step.state
                if step.duplicate:
                    c.duplicates += 1
                dispatched.extend(step.dispatched)
                outcomes.extend(step.outcomes)
                if step.reload:  # an erasure needs prior heads the state forgot: read them
                    queue[:0] = await _restore_slots(rt, st, step.reload)
            # API request/reply (issue 7): a stimulus carrying a request_id gets the
            # mailbox's answer recorded in PostgreSQL (wakeline.streams.replies); a
            # stimulus is one core event, so `step` is the one that applied it.
            if stim is not None and core_events and step is not None:
                from wakeline.streams import replies

                replies.answer(rt, stim.value, ident, step)
            if TRACE:
                trace("event", topics.stimuli.name if stim is not None else topics.changes.name,
                      p, offset, ident[1],
                      [type(e).__name__ + ":" + str(getattr(e, "job_id", "") or "")
                       for e in core_events],
                      {n: (ds.w, ds.running.id if ds.running else None,
                           ds.queued.id if ds.queued else None) for n, ds in st.ds.items()})
        wakeup, running = rt.engine.wakeup_and_running(st)
        rt.store.put(p, skey, st, wakeup, running)
        key = items[-1][1]
        rt.timers.set(p, key, wakeup)
        for d in dispatched:
            trace("dispatch", d.job_id, p)
            c.dispatched += 1
            job = JobSpec(d.job_id, d.workspace, d.derivation, d.entity, tuple(d.reasons),
                          d.run_after, 1, tuple(d.dedupe))
            jobs.append((key, job.to_json()))
    n = await rt.delivery.deliver(jobs, topics.derive.name, rt.store.flush, rt.store.written)
    c.state_writes += n
    if outcomes:
        rt.outcomes.put(outcomes)


def _seen(rt: Runtime, stamps: dict[int, float], sent: dict[int, float]) -> None:
    real = time.time()
    for p, t in stamps.items():
        rt.read_at[p] = real
        if t > rt.seen_until.get(p, 0.0):
            rt.seen_until[p] = t
    for p, t in sent.items():
        rt.read_at[p] = real
        rt.behind[p] = max(0.0, real - t)


async def _restore_slots(rt: Runtime, st: EntityState, slots: list[tuple[str, str, int]]
                         ) -> list[Any]:
    """SlotRestored events read from PostgreSQL.  Read after the erasure committed and
    before any later change of the entity is applied, so the answer is in order."""
    from wakeline.core.events import SlotRestored
    from wakeline.store.records import prior_head

    def query() -> list[Any]:
        import psycopg

        with psycopg.connect(rt.dsn) as conn:
            return [SlotRestored(c, k, below,
                                 prior_head(conn, st.workspace, st.entity, c, k, below))
                    for c, k, below in slots]

    rt.counters.restores += len(slots)
    return await asyncio.get_running_loop().run_in_executor(rt._pool, query)


def cursor_rows(dsn: str, idents: list[tuple[str, str]]
                ) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
    """The ``derivation_cursors`` rows of these entities, ``(workspace, entity)``, in one
    query: per entity, ``(derivation, watermark, last_run_at, last_outcome,
    last_job_id)``.  (One connection and query per resync took ~4 ms each: after a
    takeover, seconds for a few thousand entities with runs in flight.)"""
    import psycopg

    out: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.workspace, c.entity, c.derivation, c.watermark, c.last_run_at, "
            "c.last_outcome, c.last_job_id FROM derivation_cursors c "
            "JOIN unnest(%s::text[], %s::text[]) AS w(workspace, entity) "
            "USING (workspace, entity)",
            ([w for w, _ in idents], [e for _, e in idents])).fetchall()
    for workspace, entity, *row in rows:
        out.setdefault((workspace, entity), []).append(tuple(row))
    return out


def finished_runs(st: EntityState, rows: Iterable[tuple[Any, ...]]) -> list[Any]:
    """CursorAdvanced events for the entity's running jobs that its cursor rows
    (:func:`cursor_rows`) say have ended."""
    from wakeline.core.events import CursorAdvanced

    running = {name: ds.running.id for name, ds in st.ds.items() if ds.running is not None}
    return [CursorAdvanced(d, int(w), at.timestamp(), outcome, job_id)
            for d, w, at, outcome, job_id in rows
            if job_id is not None and job_id == running.get(d) and outcome is not None
            and at is not None]


async def _dead_letter(rt: Runtime, event: Any, code: str, reason: str) -> None:
    from wakeline.core.outcomes import OutcomeKind
    from wakeline.streams.changes import dead_letter

    rt.counters.dead_letters += 1
    await dead_letter(rt, event, code, reason)
    ident = parse_key(event.key) or ("", "")
    rt.outcomes.put([Outcome(OutcomeKind.DEAD_LETTER, f"{code}: {reason}",
                             rt.clock.now(), ident[0], ident[1], None, None,
                             {"topic": event.message.topic, "partition": event.message.partition,
                              "offset": event.message.offset})])
