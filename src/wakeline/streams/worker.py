"""Run a Wakeline worker process: Faust agents for some roles, optionally the relay.

``run_worker`` blocks until the worker is stopped (SIGINT/SIGTERM), then stops
the relay and closes every resource.  Several processes with the same app id
share the partitions of the agents' topics: the Faust agents (conditions over the
ready and stimuli topics, cron) in the group named by the app id, the readiness
consumer (change topic -> ready topic) in ``<app id>-readiness`` and the derive
consumer (derive topic -> PostgreSQL) in ``<app id>-derive``.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

import faust

from wakeline.cdc.relay import Relay
from wakeline.streams.app import AGENT_ROLES, Runtime, build_app
from wakeline.streams.derive_agent import DeriveConsumer
from wakeline.streams.gcpolicy import tune_gc
from wakeline.streams.pauses import PauseSync
from wakeline.streams.readiness import ReadinessConsumer
from wakeline.streams.tracing import trace

log = logging.getLogger("wakeline.worker")


def ensure_topics(rt: Runtime) -> None:
    """Create the engine's topics with the topology's partition counts (idempotent)."""
    from wakeline.cdc._kafka import ensure_topic
    from wakeline.streams.app import cron_topic_name

    topo = rt.topology
    for spec in (topo.topics.changes, topo.topics.ready, topo.topics.stimuli,
                 topo.topics.derive, topo.topics.dead_letter):
        ensure_topic(rt.bootstrap, spec.name, spec.partitions)
    ensure_topic(rt.bootstrap, cron_topic_name(topo), 1)
    changelog = topo.topics.state_changelog(rt.group_id)
    ensure_topic(rt.bootstrap, changelog.name, changelog.partitions,
                 config={"cleanup.policy": "compact"})


def start_relay(rt: Runtime, stop: threading.Event) -> tuple[Relay, threading.Thread]:
    topo = rt.topology
    relay = Relay(rt.dsn, rt.bootstrap, topic=topo.topics.changes.name, slot=topo.cdc.slot,
                  publication=topo.cdc.publication, partitions=topo.topics.changes.partitions,
                  snapshot="initial",
                  # Cursors before records: a rebuilt entity knows its watermarks
                  # before it sees the rows, so consumed history never re-fires.
                  tables=("derivation_cursors", "records")).start()
    thread = threading.Thread(target=relay.run_forever, args=(stop,), name="relay", daemon=True)
    thread.start()
    return relay, thread


def start_readiness(rt: Runtime, stop: threading.Event) -> ReadinessConsumer:
    """The readiness role's consumer, in a group of its own (streams/readiness.py)."""
    topics = rt.topology.topics
    consumer = ReadinessConsumer(rt.enricher(), bootstrap=rt.bootstrap,
                                 topic=topics.changes.name, ready_topic=topics.ready.name,
                                 dead_letter_topic=topics.dead_letter.name,
                                 group=f"{rt.group_id}-readiness", stop=stop,
                                 on_outcome=lambda o: rt.outcomes.put([o]),
                                 announce=rt.announce, handoff=rt.handoff,
                                 start_after=rt.agent_assigned if "conditions" in rt.roles
                                 else None)
    rt.readiness = consumer
    consumer.start()
    return consumer


def start_derive(rt: Runtime, stop: threading.Event) -> DeriveConsumer:
    """The derive role's consumer, in a group of its own (streams/derive_agent.py)."""
    topics = rt.topology.topics
    consumer = DeriveConsumer(rt.make_executor, bootstrap=rt.bootstrap,
                              topic=topics.derive.name, group=f"{rt.group_id}-derive",
                              dead_letter_topic=topics.dead_letter.name, stop=stop,
                              on_run=rt.ran, on_outcome=lambda o: rt.outcomes.put([o]),
                              announce=rt.announce, trace=trace)
    rt.derive = consumer
    consumer.start()
    return consumer


def run_worker(rt: Runtime, *, relay: bool = False, loglevel: str = "warn",
               on_started: Callable[[faust.App], Any] | None = None) -> None:
    """Run the worker's roles until SIGINT or SIGTERM.

    Only a worker with an agent role (conditions, cron) starts Faust.  A Faust app
    joins the app id's consumer group even without an agent (every app subscribes to
    its leader-election topic), so a readiness- or derive-only worker under Faust
    rebalanced every conditions worker each time it started or stopped.  Those roles
    are confluent-kafka consumers in groups of their own, run here as threads."""
    agents = bool(AGENT_ROLES & set(rt.roles))
    if on_started is not None and not agents:
        raise ValueError("on_started is called with the Faust app, which only a worker "
                         f"with the conditions or cron role runs (roles: {rt.roles})")
    ensure_topics(rt)
    app = build_app(rt) if agents else None
    tune_gc(rt.roles)
    stop = threading.Event()
    relay_parts = start_relay(rt, stop) if relay else None
    # Operator pauses from PostgreSQL (wakeline.streams.pauses), for the conditions role.
    pause_sync = PauseSync(rt, stop).start() if "conditions" in rt.roles else None
    readiness = start_readiness(rt, stop) if "readiness" in rt.roles else None
    derive = start_derive(rt, stop) if "derive" in rt.roles else None
    try:
        if app is None:
            _run_threads(rt, stop, loglevel)
        else:
            _run_faust(app, loglevel, on_started)
    finally:
        stop.set()
        if pause_sync is not None:
            pause_sync.join(10)
        if readiness is not None:
            readiness.join(10)
        if derive is not None:
            derive.join(30)
        if relay_parts is not None:
            relay_parts[1].join(10)
            relay_parts[0].close()
        rt.close()


def _run_faust(app: faust.App, loglevel: str,
               on_started: Callable[[faust.App], Any] | None) -> None:
    if on_started is not None:
        @app.task
        async def _started() -> None:
            on_started(app)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    # Faust's terminal spinner sets the root logger to DEBUG (its handler spins on every
    # record), so every debug call of Faust and aiokafka built a LogRecord: about 8% of
    # the conditions worker's CPU (py-spy, bench/stream_throughput.py).
    worker.spinner = None
    worker.execute_from_commandline()


def _run_threads(rt: Runtime, stop: threading.Event, loglevel: str) -> None:
    """The main thread of a worker without agents: wait for SIGINT or SIGTERM, printing
    the counters every ``rt.stats_interval`` seconds when asked to."""
    logging.basicConfig(level=loglevel.upper(),
                        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")

    def stopping(signum: int, _frame: Any) -> None:
        log.info("worker: signal %d, stopping", signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopping)
    while not stop.wait(rt.stats_interval or 1.0):
        if rt.stats_interval:
            rt.print_stats()
