"""The Faust application: agents, tables and timers around the pure core.

Roles (a worker runs one or several):

- ``readiness`` (wakeline.streams.readiness, a confluent-kafka consumer in a group
  of its own): parses the ``changes`` topic, dead-letters, enriches, and forwards
  the core's events as ready batches (wakeline.streams.ready);
- ``conditions``: consumes ready batches + ``stimuli`` (co-partitioned by entity),
  applies each event to the entity's state (wakeline.streams.statestore: in
  memory, changelogged to a compacted topic), sends dispatched jobs to ``derive``,
  records outcomes, keeps the time index and sends the ticks it finds due;
- ``derive`` (wakeline.streams.derive_agent, a confluent-kafka consumer in a group
  of its own): consumes ``derive`` and runs jobs in batches with :class:`DeriveExecutor`
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
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka.partitioner import murmur2

from wakeline.catalog import Catalog
from wakeline.clock import Clock, SystemClock
from wakeline.core.build import build_plan
from wakeline.core.engine import Dispatch, Engine
from wakeline.core.outcomes import Outcome
from wakeline.core.state import EntityState
from wakeline.derive import DeriveExecutor, JobSpec, RunResult
from wakeline.streams import ready, stimuli
from wakeline.streams.cron import CronScheduler
from wakeline.streams.delivery import Delivery, hold_commits
from wakeline.streams.gcpolicy import GC_SPENT, collect_between_batches
from wakeline.streams.guard import (
    OffsetGuard,
    admit_batch,
    unstick_tails,
)
from wakeline.streams.keys import entity_key, parse_key, split_state_key, state_key
from wakeline.streams.sinks import OutcomeWriter
from wakeline.streams.statestore import EntityStore, Reloaded
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
    events: int = 0  # change items and stimuli applied by the conditions agent
    duplicates: int = 0
    dead_letters: int = 0
    dispatched: int = 0
    runs: int = 0
    ticks: int = 0
    batches: int = 0  # conditions batches handled
    restores: int = 0
    tail_seeks: int = 0  # stream partitions whose dropped tail was sought back
    replayed: int = 0  # ready items at or below an offset this worker already applied
    unowned: int = 0  # messages of partitions no longer assigned (after a rebalance)
    state_writes: int = 0  # changelog messages of entity states
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
    tick_interval: float = 0.2
    #: most messages the conditions agent handles as one batch
    batch_max: int = 1000
    #: longest a message waits for its batch to fill (seconds)
    batch_wait: float = 0.003
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
        self._enricher: Any = None
        self._producer: Any = None
        self.readiness: Any = None  # the readiness role's consumer, when this worker runs it
        self.derive: Any = None  # the derive role's consumer, when this worker runs it
        #: with both the readiness and the conditions role, the ready batches the
        #: readiness thread wrote for the agent's partitions, kept decoded (ready.Handoff)
        self.handoff = ready.Handoff() if "readiness" in self.roles \
            and "conditions" in self.roles \
            and os.environ.get("WAKELINE_READY_HANDOFF", "1") != "0" else None
        #: set once the conditions agent had its first partition assignment
        self.agent_assigned = threading.Event()
        #: per ready partition, the highest source offset applied since the assignment
        self.applied: dict[int, int] = {}
        #: per ready partition, the latest arrival (``enriched_at``, s) of a record applied
        self.seen_until: dict[int, float] = {}
        #: per ready partition, when (real time) a batch of it was last applied
        self.read_at: dict[int, float] = {}
        #: per ready partition, how long (real s) before its last batch was read its
        #: newest change had been committed (the relay's or Debezium's, the readiness
        #: stage's and this agent's backlogs together)
        self.behind: dict[int, float] = {}
        self.store = EntityStore(
            bootstrap=self.bootstrap,
            topic=self.topology.topics.state_changelog(self.group_id).name,
            group=f"{self.group_id}-restore", meta=self.wakeup_and_running)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="conditions-db")
        self._io = ThreadPoolExecutor(max_workers=4, thread_name_prefix="conditions-io")
        #: the conditions agent's jobs and states (streams/delivery.py)
        self.delivery = Delivery(lambda: self.producer, self._io)

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

    def make_executor(self) -> DeriveExecutor:
        """A derive executor (its own PostgreSQL connection) for the derive role."""
        return DeriveExecutor(self.catalog, self.dsn, clock=self.clock, plan=self.plan)

    def ran(self, result: RunResult) -> None:
        """A derive run ended (from a derive executor thread)."""
        self.counters.runs += 1
        if self.on_run is not None:
            self.on_run(result)

    def enricher(self) -> Any:
        if self._enricher is None:
            from wakeline.store import Store
            from wakeline.streams.readiness import Enricher

            self._enricher = Enricher(self.catalog, Store.connect(self.dsn))
        return self._enricher

    @property
    def producer(self) -> Any:
        """The conditions agent's librdkafka producer: jobs and state changelog messages
        (one ``produce`` call each, against Faust's producer path per message)."""
        if self._producer is None:
            from confluent_kafka import Producer

            from wakeline.cdc._kafka import producer_config

            self._producer = Producer(producer_config(self.bootstrap, {
                "linger.ms": 1, "client.id": "wakeline-conditions"}))
        return self._producer

    def wakeup_and_running(self, st: EntityState) -> tuple[float | None, bool]:
        """What the state changelog carries ahead of a state (streams/statestore.py)."""
        return (self.engine.next_wakeup(st),
                any(ds.running is not None for ds in st.ds.values()))

    @property
    def group_id(self) -> str:
        """The Faust app id, the consumer group of the conditions and cron roles; the
        readiness and derive roles' groups are ``<group_id>-readiness`` and
        ``<group_id>-derive``."""
        return self.app_id or f"wakeline-{self.topology.name}"

    def partition_of(self, key: bytes) -> int:
        return (murmur2(key) & 0x7FFFFFFF) % self.partitions

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
        if self._outcomes is not None:
            self._outcomes.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._io.shutdown(wait=False, cancel_futures=True)


def cron_topic_name(topo: Topology) -> str:
    """The cron scan pages' topic (one partition: pages of one scan stay in order)."""
    return f"{topo.topics.changes.name}.cron"


def build_app(rt: Runtime) -> faust.App:
    from wakeline.services.paths import wakeline_home

    topo = rt.topology
    app_id = rt.group_id
    datadir = wakeline_home() / "faust" / app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    force_copartitioned_assignor()
    app = faust.App(
        app_id,
        # Faust's local files (offsets) under the runtime folder, not in the working
        # directory.
        datadir=str(datadir),
        broker=f"kafka://{rt.bootstrap}",
        store="memory://",
        topic_partitions=topo.topics.changes.partitions,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        stream_buffer_maxsize=16384,
        broker_max_poll_records=2000,
        topic_allow_declare=True,
        producer_acks=-1,
        broker_client_id="wakeline-faust",
        table_standby_replicas=0,
    )
    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    ready_name = topo.topics.ready.name
    source = app.topic(ready_name, topo.topics.stimuli.name, **raw)
    stimuli_topic = app.topic(topo.topics.stimuli.name, partitions=topo.topics.stimuli.partitions,
                              **raw)
    cron_topic = app.topic(cron_topic_name(topo), partitions=1, **raw)
    rt.dead_letter_topic = app.topic(topo.topics.dead_letter.name,
                                     partitions=topo.topics.dead_letter.partitions, **raw)
    app.wakeline = rt  # type: ignore[attr-defined]
    guards = rt.guards = {
        "conditions": OffsetGuard("conditions", frozenset({ready_name,
                                                           topo.topics.stimuli.name})),
    }
    active_guards = [guards["conditions"]] if "conditions" in rt.roles else []

    @app.timer(interval=1.0, name="offset-watchdog")
    async def offset_watchdog() -> None:
        rt.counters.tail_seeks += await unstick_tails(app, active_guards)

    if rt.stats_interval:

        @app.timer(interval=rt.stats_interval, name="stats")
        async def stats() -> None:
            c = rt.counters
            r, d = rt.readiness, rt.derive
            print("wakeline-stats", json.dumps({
                "events": c.events, "batches": c.batches, "dispatched": c.dispatched,
                "runs": c.runs, "ticks": c.ticks, "dead_letters": c.dead_letters,
                "duplicates": c.duplicates, "replayed": c.replayed,
                "state_writes": c.state_writes, "entities": len(rt.store),
                "readiness": None if r is None else {
                    "consumed": r.consumed, "forwarded": r.forwarded, "batches": r.batches,
                    "enriched": r.enriched, "dead_letters": r.dead_letters},
                "handoff": None if rt.handoff is None else {
                    "kept": rt.handoff.kept, "taken": rt.handoff.taken,
                    "dropped": rt.handoff.dropped, "full": rt.handoff.full},
                "derive": None if d is None else {
                    "consumed": d.consumed, "batches": d.batches, "runs": d.runs,
                    "dead_letters": d.dead_letters},
                "gc": GC_SPENT, "by_outcome": c.by_outcome}), flush=True)

    @app.on_partitions_revoked.connect
    async def forget_offsets(sender: Any, revoked: Any, **kw: Any) -> None:
        for g in guards.values():
            g.forget(revoked)
        if rt.handoff is not None:  # what was kept for them will not be taken here
            rt.handoff.own(rt.handoff.owned - {tp.partition for tp in revoked
                                               if tp.topic == ready_name})

    if "conditions" in rt.roles:

        @app.agent(source, name="conditions")
        async def conditions(stream: faust.StreamT) -> None:
            # Batches of up to batch_max messages (each ready message holds many
            # changes), or what arrived within batch_wait seconds; Faust acks a batch
            # after it was handled, and it is handled once its jobs were acknowledged
            # by the broker, its states handed to the producer and its outcomes to the
            # writer.  Faust's offset commits wait for the states (streams/delivery.py).
            hold_commits(app.consumer, rt.delivery)
            async for events in stream.take_events(rt.batch_max, within=rt.batch_wait):
                batch = await admit_batch(app, guards["conditions"], events)
                if batch:
                    await _handle_batch(app, rt, batch)
                    rt.counters.batches += 1
                collect_between_batches("conditions")

        @app.timer(interval=rt.tick_interval, name="ticks")
        async def ticks() -> None:
            now = rt.clock.now().timestamp()
            bounds = event_times(app, rt, guards["conditions"], ready_name, now)
            for key in rt.timers.pop_due(now, bounds=bounds):
                rt.counters.ticks += 1
                await stimuli_topic.send(key=key, value=stimuli.encode("tick"))

        @app.on_partitions_assigned.connect
        async def reload_states(sender: Any, assigned: Any, **kw: Any) -> None:
            owned = {tp.partition for tp in assigned if tp.topic == ready_name}
            paired = {tp.partition for tp in assigned if tp.topic == topo.topics.stimuli.name}
            if owned != paired:
                log.error("ready partitions %s and stimuli partitions %s are not co-partitioned"
                          " on this worker: entities of the difference see half their events",
                          sorted(owned), sorted(paired))
            rt.applied.clear()  # another worker may have applied some since: the core decides
            if rt.handoff is not None:
                rt.handoff.own(owned)
            rt.agent_assigned.set()
            gone = rt.store.keep_only(owned)
            for p in gone:
                rt.seen_until.pop(p, None)
                rt.read_at.pop(p, None)
                rt.behind.pop(p, None)
            rt.timers.drop_partitions(gone)
            trace("assigned", sorted(owned), "dropped", sorted(gone))
            loop = asyncio.get_running_loop()
            t0 = time.monotonic()
            loads = [f for p in sorted(owned)
                     if (f := rt.store.loading(p, loop, rt._io)) is not None]
            asyncio.ensure_future(_after_reload(rt, stimuli_topic, loads, owned, t0))

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


#: how long a fetch may wait at the broker for data (ms); Faust hard-codes 1,500
FETCH_MAX_WAIT_MS = 20


def force_copartitioned_assignor() -> None:
    """Make Faust's worker consumer use Faust's own partition assignor, and fetch
    without Faust's 1.5 s wait.

    Faust 0.15 picks aiokafka's round-robin assignor when the app has no changelog
    tables, and round robin does not keep partition *p* of the ready topic and of
    the stimuli topic on one worker, which the per-entity state needs (the entity
    store is Wakeline's own, so the app has no Faust tables).  Faust's assignor
    gives co-subscribed topics with equal partition counts the same partition
    numbers on the same worker.

    Faust also hard-codes ``fetch_max_wait_ms=1500``; Tansu answers a fetch only
    when that wait expires unless it has data, so each stimulus or batch arriving
    on an idle partition waited up to 1.5 s on the embedded default
    (bench/commit_to_job.py).  Idempotent."""
    from faust.transport.drivers import aiokafka as driver

    create = driver.AIOKafkaConsumerThread._create_worker_consumer
    if getattr(create, "wakeline", False):
        return

    def co_partitioned(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        self._assignor = self.app.assignor
        consumer._partition_assignment_strategy = [self.app.assignor]
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer

    co_partitioned.wakeline = True  # type: ignore[attr-defined]
    driver.AIOKafkaConsumerThread._create_worker_consumer = co_partitioned


async def _after_reload(rt: Runtime, stimuli_topic: Any, loads: list[Any], owned: set[int],
                        t0: float) -> None:
    """Once the assigned partitions' states are loaded: their timers, a resync for
    each entity whose run was in flight, and the ready line."""
    done: list[Reloaded] = []
    for fut in loads:
        try:
            done.append(await fut)
        except asyncio.CancelledError:
            continue  # revoked before it finished
        except Exception:
            log.exception("state reload failed; the worker stops (its partitions move)")
            raise
    resync: list[bytes] = []
    for r in done:
        for skey, wakeup in r.wakeups:
            rt.timers.set(r.partition, entity_key(*split_state_key(skey)), wakeup)
        resync.extend(entity_key(*split_state_key(skey)) for skey in r.running)
    for key in resync:
        trace("resync", key)
        await stimuli_topic.send(key=key, value=stimuli.encode("resync"))
    wall = time.monotonic() - t0
    log.info("states reloaded: %s", ", ".join(
        f"p{r.partition} {r.entities} entities ({r.messages} messages, {r.seconds:.2f} s)"
        for r in done) or "none needed")
    if rt.announce:
        # "N entities": every entity of the owned partitions; "read M": changelog
        # messages read by this reload (partitions kept through a rebalance read on
        # from where this worker's knowledge ended, usually nothing).
        print(f"wakeline: conditions ready, partitions {sorted(owned)}, "
              f"{len(rt.store)} entities (read {sum(r.messages for r in done)} state "
              f"messages in {wall:.3f} s)", flush=True)


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


async def _handle_batch(app: Any, rt: Runtime, events: list[Any]) -> None:
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
    _seen(rt, stamps, sent)
    if not groups:
        return
    loop = asyncio.get_running_loop()
    for p in {item[0] for items in groups.values() for item in items}:
        pending = rt.store.loading(p, loop, rt._io)
        if pending is not None:
            await pending
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
                core_events = await _finished_runs(rt, st)
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
        wakeup, running = rt.wakeup_and_running(st)
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
