"""The Faust application: agents, tables and timers around the pure core.

Roles (a worker runs one or several):

- ``conditions``: consumes ``changes`` + ``stimuli`` (co-partitioned by entity),
  applies each event to the entity's state (a changelogged Faust table), sends
  dispatched jobs to ``derive``, records outcomes, keeps the time index and sends
  the ticks it finds due;
- ``derive``: consumes ``derive`` and runs jobs with :class:`DeriveExecutor`
  (co-commit in PostgreSQL; the cursor row's change comes back on ``changes``
  and re-evaluates the entity, in order with its records);
- ``cron``: plans buckets (once per bucket across workers, durably in
  PostgreSQL) and pages entity scans through the ``cron`` topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka.partitioner import murmur2

from wakeline.catalog import Catalog
from wakeline.clock import Clock, SystemClock
from wakeline.core.build import build_plan
from wakeline.core.codec import decode_state, encode_state
from wakeline.core.engine import Dispatch, Engine
from wakeline.core.outcomes import Outcome
from wakeline.core.state import EntityState
from wakeline.derive import DeriveExecutor, JobSpec, RunResult
from wakeline.streams import derive_agent, stimuli
from wakeline.streams.changes import decode_change
from wakeline.streams.cron import CronScheduler
from wakeline.streams.guard import (
    OffsetGuard,
    admit_batch,
    unstick_recovery,
    unstick_tails,
)
from wakeline.streams.keys import entity_key, parse_key, split_state_key, state_key
from wakeline.streams.sinks import OutcomeWriter
from wakeline.streams.timers import TimerIndex
from wakeline.topology import Topology

#: WAKELINE_TRACE=1 prints one line per dispatch, cursor end and job result (debugging
#: hand-offs between workers).
TRACE = os.environ.get("WAKELINE_TRACE") == "1"


def trace(*parts: Any) -> None:
    if TRACE:
        print("wakeline-trace", os.getpid(), *parts, flush=True)


log = logging.getLogger("wakeline.streams")

ROLES = ("readiness", "conditions", "derive", "cron")


@dataclass
class Counters:
    events: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    dispatched: int = 0
    runs: int = 0
    ticks: int = 0
    batches: int = 0  # conditions batches handled
    restores: int = 0
    tail_seeks: int = 0  # stream partitions whose dropped tail was sought back
    recovery_seeks: int = 0  # stalled changelog recoveries sought back (streams/guard.py)
    by_outcome: dict[str, int] = field(default_factory=dict)


@dataclass
class Runtime:
    """What one worker process needs; shared by its agents."""

    topology: Topology
    catalog: Catalog
    dsn: str
    bootstrap: str
    roles: tuple[str, ...] = ROLES
    clock: Clock = field(default_factory=SystemClock)
    app_id: str | None = None
    on_run: Callable[[RunResult], None] | None = None
    on_outcome: Callable[[Outcome], None] | None = None
    derive_concurrency: int = 2
    tick_interval: float = 0.2
    #: most messages the conditions agent handles as one batch
    batch_max: int = 1000
    #: longest a message waits for its batch to fill (seconds)
    batch_wait: float = 0.01
    announce: bool = False
    #: print a ``wakeline-stats {json}`` line of the counters every this many seconds
    #: (``WAKELINE_STATS_INTERVAL``; benchmarks and operators watching a worker)
    stats_interval: float | None = None
    guards: dict[str, Any] = field(default_factory=dict)  # streams/guard.OffsetGuard by agent

    def __post_init__(self) -> None:
        self.plan = build_plan(self.catalog)
        self.engine = Engine(self.plan)
        self.timers = TimerIndex()
        self.counters = Counters()
        self.partitions = self.topology.topics.changes.partitions
        self._outcomes: OutcomeWriter | None = None
        self._executors: asyncio.Queue[DeriveExecutor] | None = None
        self._enricher: Any = None
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.derive_concurrency),
                                        thread_name_prefix="derive")

    # -- resources --------------------------------------------------------------------

    @property
    def outcomes(self) -> OutcomeWriter:
        if self._outcomes is None:
            self._outcomes = OutcomeWriter(self.dsn, on_outcome=self._count_outcome)
        return self._outcomes

    def _count_outcome(self, o: Outcome) -> None:
        k = str(o.kind)
        self.counters.by_outcome[k] = self.counters.by_outcome.get(k, 0) + 1
        if self.on_outcome is not None:
            self.on_outcome(o)

    async def executor(self) -> DeriveExecutor:
        if self._executors is None:
            self._executors = asyncio.Queue()
            for _ in range(max(1, self.derive_concurrency)):
                self._executors.put_nowait(DeriveExecutor(self.catalog, self.dsn,
                                                          clock=self.clock, plan=self.plan))
        return await self._executors.get()

    def enricher(self) -> Any:
        if self._enricher is None:
            from wakeline.store import Store
            from wakeline.streams.readiness import Enricher

            self._enricher = Enricher(self.catalog, Store.connect(self.dsn))
        return self._enricher

    @property
    def group_id(self) -> str:
        """The Faust app id, the consumer group of the conditions, derive and cron
        roles; the readiness role's group is ``<group_id>-readiness``."""
        return self.app_id or f"wakeline-{self.topology.name}"

    def partition_of(self, key: bytes) -> int:
        return (murmur2(key) & 0x7FFFFFFF) % self.partitions

    def close(self) -> None:
        if self._outcomes is not None:
            self._outcomes.close()
        if self._executors is not None:
            while not self._executors.empty():
                self._executors.get_nowait().close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class EntityTable(faust.Table):
    """The state table, whose changelog partition is the entity's partition computed
    from the key (the same murmur2 partitioning as the source topics), so a batch can
    write the states of several partitions' entities after the events that made them
    (Faust's Table takes the partition from the current event)."""

    def __init__(self, *args: Any, partition_of: Callable[[str], int], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._partition_of = partition_of

    def partition_for_key(self, key: Any) -> int | None:
        return self._partition_of(key)


def cron_topic_name(topo: Topology) -> str:
    """The cron scan pages' topic (one partition: pages of one scan stay in order)."""
    return f"{topo.topics.changes.name}.cron"


def build_app(rt: Runtime) -> faust.App:
    from wakeline.services.paths import wakeline_home

    topo = rt.topology
    app_id = rt.group_id
    datadir = wakeline_home() / "faust" / app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        # Faust's local table files (RocksDB, offsets) under the runtime folder, not
        # in the working directory.
        datadir=str(datadir),
        broker=f"kafka://{rt.bootstrap}",
        store="rocksdb://" if topo.state_store == "rocksdb" else "memory://",
        topic_partitions=topo.topics.changes.partitions,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        stream_buffer_maxsize=16384,
        broker_max_poll_records=2000,
        topic_allow_declare=True,
        producer_acks=-1,
        table_standby_replicas=0,
    )
    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    source = app.topic(topo.topics.changes.name, topo.topics.stimuli.name, **raw)
    stimuli_topic = app.topic(topo.topics.stimuli.name, partitions=topo.topics.stimuli.partitions,
                              **raw)
    derive_topic = app.topic(topo.topics.derive.name, partitions=topo.topics.derive.partitions,
                             **raw)
    cron_topic = app.topic(cron_topic_name(topo), partitions=1, **raw)
    rt.dead_letter_topic = app.topic(topo.topics.dead_letter.name,
                                     partitions=topo.topics.dead_letter.partitions, **raw)
    state = app.tables.add(EntityTable(
        app, name="wakeline-entity-state", default=None,
        partitions=topo.topics.changes.partitions, key_type=str, value_type=bytes,
        partition_of=lambda skey: rt.partition_of(entity_key(*split_state_key(skey)))))
    app.wakeline = rt  # type: ignore[attr-defined]
    guards = rt.guards = {
        "conditions": OffsetGuard("conditions", frozenset({topo.topics.changes.name,
                                                           topo.topics.stimuli.name})),
        "derive": OffsetGuard("derive", frozenset({topo.topics.derive.name})),
    }
    active_guards = [guards[n] for n in ("conditions", "derive") if n in rt.roles]

    @app.timer(interval=1.0, name="offset-watchdog")
    async def offset_watchdog() -> None:
        rt.counters.tail_seeks += await unstick_tails(app, active_guards)

    if rt.stats_interval:

        @app.timer(interval=rt.stats_interval, name="stats")
        async def stats() -> None:
            c = rt.counters
            print("wakeline-stats", json.dumps({
                "events": c.events, "batches": c.batches, "dispatched": c.dispatched,
                "runs": c.runs,
                "ticks": c.ticks, "dead_letters": c.dead_letters, "duplicates": c.duplicates,
                "by_outcome": c.by_outcome}), flush=True)

    @app.on_partitions_revoked.connect
    async def forget_offsets(sender: Any, revoked: Any, **kw: Any) -> None:
        for g in guards.values():
            g.forget(revoked)

    if "conditions" in rt.roles:

        @app.agent(source, name="conditions")
        async def conditions(stream: faust.StreamT) -> None:
            # Batches of up to batch_max messages, or what arrived within batch_wait
            # seconds; Faust acks a batch after it was handled, so an offset is
            # committed only once its message's effects (state, jobs, outcomes) were
            # handed to the producer and the outcome writer.
            async for events in stream.take_events(rt.batch_max, within=rt.batch_wait):
                batch = await admit_batch(app, guards["conditions"], events)
                if batch:
                    await _handle_batch(rt, state, derive_topic, batch)
                    rt.counters.batches += 1

        @app.timer(interval=1.0, name="recovery-watchdog")
        async def recovery_watchdog() -> None:
            rt.counters.recovery_seeks += await unstick_recovery(app)

        @app.timer(interval=rt.tick_interval, name="ticks")
        async def ticks() -> None:
            for key in rt.timers.pop_due(rt.clock.now().timestamp()):
                rt.counters.ticks += 1
                await stimuli_topic.send(key=key, value=stimuli.encode("tick"))

        @state.on_recover
        async def rebuild_time_index() -> None:
            assigned = {tp.partition for tp in app.assignor.assigned_actives()
                        if tp.topic == topo.topics.changes.name}
            n = 0
            resync: list[bytes] = []
            for skey, data in state.items():
                if not data:
                    continue
                key = entity_key(*split_state_key(skey))
                p = rt.partition_of(key)
                if p in assigned:
                    st = load_state(data, *split_state_key(skey))
                    rt.timers.set(p, key, rt.engine.next_wakeup(st))
                    n += 1
                    if any(ds.running is not None for ds in st.ds.values()):
                        resync.append(key)
                        trace("resync", key)
            for key in resync:
                await stimuli_topic.send(key=key, value=stimuli.encode("resync"))
            trace("recovered", sorted(assigned), n)
            log.info("time index rebuilt: %d entities, %d due entries", n, len(rt.timers))
            if rt.announce:
                print(f"wakeline: conditions ready, partitions {sorted(assigned)}, "
                      f"{n} entities", flush=True)

        @app.on_partitions_revoked.connect
        async def on_revoked(sender: Any, revoked: Any, **kw: Any) -> None:
            trace("revoked", sorted(tp.partition for tp in revoked
                                    if tp.topic == topo.topics.changes.name))
            rt.timers.drop_partitions({tp.partition for tp in revoked
                                       if tp.topic == topo.topics.changes.name})

    if "derive" in rt.roles:

        # One actor: the offset guard needs to see every message of its partitions
        # (several actors would each see a share and every share has gaps).  Jobs
        # run in batches (streams/derive_agent.py).
        @app.agent(derive_topic, name="derive")
        async def derive(stream: faust.StreamT) -> None:
            await derive_agent.consume(app, rt, stream, guards["derive"], trace)

    if "cron" in rt.roles:
        scheduler = CronScheduler(rt, stimuli_topic, cron_topic)

        @app.timer(interval=1.0, name="cron-plan")
        async def cron_plan() -> None:
            await scheduler.plan()

        @app.agent(cron_topic, name="cron-pages")
        async def cron_pages(stream: faust.StreamT) -> None:
            async for page in stream:
                await scheduler.page(page)

    if TRACE:

        @app.timer(interval=2.0, name="trace-consumer")
        async def trace_consumer() -> None:
            c = app.consumer
            fmt = lambda tps: sorted(f"{tp.topic.rsplit('.', 1)[-1][:8]}{tp.partition}"  # noqa: E731
                                     for tp in (tps or ()))
            trace("consumer", "assigned", fmt(c.assignment()), "paused", fmt(c._paused_partitions),
                  "active", fmt(c._active_partitions), "buffered", fmt(c._buffered_partitions),
                  "flow", c.flow_active,
                  "committed", {fmt([tp])[0]: o for tp, o in c._committed_offset.items()},
                  "read", {fmt([tp])[0]: o for tp, o in c._read_offset.items()})
            with contextlib.suppress(Exception):
                ak = c._thread._consumer
                sub = ak._subscription.subscription
                states = {}
                for tp in sub.assignment.tps:
                    if tp.topic.endswith(("changes", "changelog")):
                        v = sub.assignment.state_value(tp)
                        states[f"{tp.topic.rsplit('.', 1)[-1][:8]}{tp.partition}"] = (
                            v._position, v.highwater, v._status.name, v.paused)
                trace("aiokafka", states, "records", fmt(ak._fetcher._records.keys()),
                      "reassign", ak._subscription.reassignment_in_progress)
                rec = app.tables.recovery
                trace("recovery", "in", rec.in_recovery, "end", rec.signal_recovery_end.is_set(),
                      "offsets", {fmt([tp])[0]: o for tp, o in rec.active_offsets.items()},
                      "highwaters", {fmt([tp])[0]: o for tp, o in rec.active_highwaters.items()},
                      "queue", app.tables.changelog_queue.qsize()
                      if hasattr(app.tables.changelog_queue, "qsize") else "?")

    @app.on_rebalance_complete.connect
    async def on_rebalanced(sender: Any, **kw: Any) -> None:
        if rt.announce:
            print(f"wakeline: rebalance complete, roles {','.join(rt.roles)}", flush=True)

    return app


async def _parse(rt: Runtime, event: Any) -> tuple[tuple[str, str], list[Any], bool] | None:
    """(entity, core events, resync) of one message; ``None`` when it was dead-lettered
    or carries nothing for the core."""
    msg = event.message
    key: bytes | None = event.key
    if msg.topic == rt.topology.topics.stimuli.name:
        ident = parse_key(key)
        try:
            decoded_stimulus = stimuli.decode(event.value)
        except stimuli.BadStimulus as exc:
            await _dead_letter(rt, event, exc.code, str(exc))
            return None
        resync = isinstance(decoded_stimulus, stimuli.Resync)
        core_events: list[Any] = [] if resync else [decoded_stimulus]
    else:
        resync = False
        decoded = decode_change(key, event.value)
        if decoded.error is not None:
            await _dead_letter(rt, event, decoded.code, decoded.error)
            return None
        if not decoded.events:
            return None
        ident = decoded.entity
        core_events = decoded.events
    if ident is None or key is None:
        await _dead_letter(rt, event, "stream.bad_key", "message key is not {workspace, entity}")
        return None
    return ident, core_events, resync


async def _handle_batch(rt: Runtime, state: Any, derive_topic: Any, events: list[Any]) -> None:
    """Apply a batch of messages: each entity's state is read and written once per batch
    (one changelog message per entity, not per event), its messages applied in offset
    order; outcomes go out in one batch.  Entities are independent, so grouping by
    entity keeps every order that matters."""
    groups: dict[tuple[str, str], list[tuple[Any, list[Any], bool]]] = {}
    for event in events:
        parsed = await _parse(rt, event)
        if parsed is not None:
            ident, core_events, resync = parsed
            groups.setdefault(ident, []).append((event, core_events, resync))
    if not groups:
        return
    stimuli_name = rt.topology.topics.stimuli.name
    now = rt.clock.now().timestamp()
    outcomes: list[Outcome] = []
    for ident, items in groups.items():
        skey = state_key(*ident)
        data = state.get(skey)
        st = load_state(data, *ident) if data else EntityState(ident[0], ident[1])
        dispatched: list[Dispatch] = []
        for event, core_events, resync in items:
            rt.counters.events += 1
            if resync:
                core_events = await _finished_runs(rt, st)
            queue = list(core_events)
            step = None
            while queue:
                step = rt.engine.apply(st, queue.pop(0), now)
                st = step.state
                if step.duplicate:
                    rt.counters.duplicates += 1
                dispatched.extend(step.dispatched)
                outcomes.extend(step.outcomes)
                if step.reload:  # an erasure needs prior heads the state forgot: read them
                    queue[:0] = await _restore_slots(rt, st, step.reload)
            # API request/reply (issue 7): a stimulus carrying a request_id gets the
            # mailbox's answer recorded in PostgreSQL (wakeline.streams.replies); a
            # stimulus is one core event, so `step` is the one that applied it.
            if core_events and step is not None and event.message.topic == stimuli_name:
                from wakeline.streams import replies

                replies.answer(rt, event.value, ident, step)
            if TRACE:
                msg = event.message
                trace("event", msg.topic, msg.partition, msg.offset, ident[1],
                      [type(e).__name__ + ":" + str(getattr(e, "job_id", "") or "")
                       for e in core_events],
                      {n: (ds.w, ds.running.id if ds.running else None,
                           ds.queued.id if ds.queued else None) for n, ds in st.ds.items()})
        state[skey] = dump_state(st)
        last = items[-1][0]
        rt.timers.set(last.message.partition, last.key, rt.engine.next_wakeup(st))
        for d in dispatched:
            trace("dispatch", d.job_id, last.message.partition)
            rt.counters.dispatched += 1
            job = JobSpec(d.job_id, d.workspace, d.derivation, d.entity, tuple(d.reasons),
                          d.run_after, 1, tuple(d.dedupe))
            await derive_topic.send(key=last.key, value=job.to_json())
    if outcomes:
        rt.outcomes.put(outcomes)


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


async def _finished_runs(rt: Runtime, st: EntityState) -> list[Any]:
    """CursorAdvanced events for running jobs that PostgreSQL says have ended."""
    from wakeline.core.events import CursorAdvanced

    running = {name: ds.running.id for name, ds in st.ds.items() if ds.running is not None}
    if not running:
        return []

    def query() -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(rt.dsn) as conn:
            return conn.execute(
                "SELECT derivation, watermark, last_run_at, last_outcome, last_job_id "
                "FROM derivation_cursors WHERE workspace = %s AND entity = %s "
                "AND derivation = ANY(%s)", (st.workspace, st.entity, list(running))).fetchall()

    rows = await asyncio.get_running_loop().run_in_executor(rt._pool, query)
    return [CursorAdvanced(d, int(w), at.timestamp(), outcome, job_id)
            for d, w, at, outcome, job_id in rows
            if job_id == running.get(d) and outcome is not None and at is not None]


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


async def _run_job(rt: Runtime, job: JobSpec) -> None:
    await derive_agent.run_jobs(rt, [job], trace)


def dump_state(st: EntityState) -> bytes:
    # The table stores raw bytes in the compact versioned form of wakeline.core.codec
    # (about 130 B per entity; workspace and entity come from the key).
    return encode_state(st)


def load_state(data: bytes, workspace: str, entity: str) -> EntityState:
    return decode_state(data, workspace, entity)
