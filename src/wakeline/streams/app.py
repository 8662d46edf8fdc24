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
from wakeline.core.engine import Engine
from wakeline.core.outcomes import Outcome
from wakeline.derive import DeriveExecutor, RunResult
from wakeline.streams import ready, stimuli
from wakeline.streams.batch import event_times, handle_batch
from wakeline.streams.cron import CronScheduler
from wakeline.streams.delivery import Delivery, hold_commits, produce
from wakeline.streams.gcpolicy import GC_SPENT, collect_between_batches
from wakeline.streams.guard import (
    OffsetGuard,
    admit_batch,
    unstick_tails,
)
from wakeline.streams.keys import entity_key, split_state_key
from wakeline.streams.sinks import OutcomeWriter
from wakeline.streams.statestore import EntityStore, Reloaded
from wakeline.streams.timers import TimerIndex
from wakeline.streams.tracing import TRACE, trace
from wakeline.topology import Topology

log = logging.getLogger("wakeline.streams")

ROLES = ("readiness", "conditions", "derive", "cron")
#: the roles that run Faust agents in the app's consumer group
AGENT_ROLES = frozenset({"conditions", "cron"})


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
        self._warmed = False  # warm_producer() done
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
            group=f"{self.group_id}-restore", meta=self.engine.wakeup_and_running)
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

    def warm_producer(self, timeout: float = 10.0) -> None:
        """Connect the producer before the ready line, once per process
        (:func:`wakeline.cdc._kafka.warm_producer`): else the first batch's job flush
        waited ~0.5 s."""
        if not self._warmed:
            from wakeline.cdc._kafka import warm_producer

            self._warmed = warm_producer(
                self.producer, (self.topology.topics.derive.name, self.store.topic), timeout)

    def print_stats(self) -> None:
        """The ``wakeline-stats {json}`` line of the counters."""
        c, r, d, h = self.counters, self.readiness, self.derive, self.handoff
        print("wakeline-stats", json.dumps({
            "events": c.events, "batches": c.batches, "dispatched": c.dispatched,
            "runs": c.runs, "ticks": c.ticks, "dead_letters": c.dead_letters,
            "duplicates": c.duplicates, "replayed": c.replayed,
            "state_writes": c.state_writes, "entities": len(self.store),
            "readiness": None if r is None else {
                "consumed": r.consumed, "forwarded": r.forwarded, "batches": r.batches,
                "enriched": r.enriched, "dead_letters": r.dead_letters},
            "handoff": None if h is None else {
                "kept": h.kept, "taken": h.taken, "dropped": h.dropped, "full": h.full},
            "derive": None if d is None else {
                "consumed": d.consumed, "batches": d.batches, "runs": d.runs,
                "dead_letters": d.dead_letters},
            "gc": GC_SPENT, "by_outcome": c.by_outcome}), flush=True)

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
            rt.print_stats()

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
                    await handle_batch(app, rt, batch)
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
            asyncio.ensure_future(_after_reload(rt, loads, owned, t0)) \
                .add_done_callback(_report_failure)

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


def _report_failure(task: asyncio.Future[Any]) -> None:
    """Log a background task's exception when it ends, not when it is collected.  (A
    failed reload also fails every batch of its partition, which awaits it.)"""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("after the state reload: %s", exc, exc_info=exc)


async def send_resyncs(rt: Runtime, topic: str, keys: list[bytes], *, attempts: int = 5,
                       pause: float = 0.5) -> None:
    """A ``resync`` stimulus for each entity key, through the agent's librdkafka
    producer (partitioned by key as every producer of the stimuli topic is), and wait
    until the broker took them all.  One Faust ``send`` each held the event loop
    ~0.35 ms: with 5,000 runs in flight in the gained partitions, the worker was
    ready 1.7-2.0 s after its reload started, against 0.09-0.11 s now
    (bench/recovery.py --in-flight, BENCHMARKS.md).

    A resync the broker refuses is sent again (``attempts`` times in all, ``pause``
    doubling between them; a second resync of an entity reads the same cursor rows):
    without it, a run that ended while its entity had no owner would hold the mailbox
    until a worker gains the entity's partition again.  Raises once they are spent."""
    producer = rt.producer
    value = stimuli.encode("resync")
    loop = asyncio.get_running_loop()
    pending = list(keys)
    for attempt in range(attempts):
        refused: list[tuple[bytes, Any]] = []

        def delivered(err: Any, msg: Any, refused: list[tuple[bytes, Any]] = refused) -> None:
            if err is not None:
                refused.append((msg.key(), err))

        for key in pending:
            trace("resync", key)
            produce(producer, topic, value, key, None, delivered)
        left = await loop.run_in_executor(rt._io, producer.flush, 60.0)
        if not left and not refused:
            return
        # Refused ones are sent again; any still queued go with the next flush.
        pending = [key for key, _ in refused]
        if attempt + 1 < attempts:
            log.warning("the broker did not take %d resync stimuli%s (%d messages still "
                        "queued); sending again", len(refused),
                        f" ({refused[0][1]})" if refused else "", left)
            await asyncio.sleep(pause * 2 ** attempt)
    what = f"{len(pending)} of {len(keys)} resync stimuli" if pending \
        else f"{left} queued message(s), resync stimuli among them"
    raise RuntimeError(f"the broker did not take {what} after {attempts} attempts; those "
                       "entities' runs in flight are checked again only when a worker gains "
                       "their partition")


async def _after_reload(rt: Runtime, loads: list[Any], owned: set[int], t0: float) -> None:
    """Once the assigned partitions' states are loaded: their timers, a resync for
    each entity whose run was in flight, and the ready line."""
    done: list[Reloaded] = []
    for fut in loads:
        try:
            done.append(await fut)
        except asyncio.CancelledError:
            continue  # revoked before it finished
        except Exception as exc:
            raise RuntimeError(f"state reload failed: {exc!r}") from exc  # _report_failure
    resync: list[bytes] = []
    for r in done:
        for skey, wakeup in r.wakeups:
            rt.timers.set(r.partition, entity_key(*split_state_key(skey)), wakeup)
        resync.extend(entity_key(*split_state_key(skey)) for skey in r.running)
    if resync:
        await send_resyncs(rt, rt.topology.topics.stimuli.name, resync)
    await asyncio.get_running_loop().run_in_executor(rt._io, rt.warm_producer)
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
