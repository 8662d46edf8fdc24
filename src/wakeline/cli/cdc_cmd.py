"""``wakeline cdc relay|snapshot|connect``: PostgreSQL changes onto the change topic.

- ``relay``: the built-in pgoutput relay in the foreground until Ctrl-C.
- ``snapshot``: the current rows as ``op: r`` events (rebuild after topic loss),
  with a progress bar on stderr.
- ``connect``: Kafka Connect standalone with the Debezium connector, in the
  foreground until Ctrl-C (``--print-config`` prints the connector JSON only).

Addresses: ``--dsn`` / ``$WAKELINE_PG_DSN`` / the running ``wakeline services``;
``--bootstrap`` / ``$WAKELINE_BOOTSTRAP`` / the running broker.  Topic, slot and
publication come from ``--topology`` when given, else the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from wakeline.errors import ConfigError


def _dsn(args: argparse.Namespace) -> str:
    dsn = args.dsn or os.environ.get("WAKELINE_PG_DSN")
    if not dsn:
        from wakeline.services import state

        dsn = (state.load().get("postgres") or {}).get("dsn")
    if not dsn:
        raise ConfigError("no database: pass --dsn, set WAKELINE_PG_DSN, or start one with "
                          "`wakeline services up`")
    return str(dsn)


def _bootstrap(args: argparse.Namespace) -> str:
    boot = args.bootstrap or os.environ.get("WAKELINE_BOOTSTRAP")
    if not boot:
        from wakeline.services import state

        boot = (state.load().get("broker") or {}).get("bootstrap")
    if not boot:
        raise ConfigError("no broker: pass --bootstrap, set WAKELINE_BOOTSTRAP, or start one "
                          "with `wakeline services up`")
    return str(boot)


def _settings(args: argparse.Namespace, *, debezium: bool = False) -> dict[str, Any]:
    topic, partitions = "wakeline.changes", 4
    slot = "wakeline_debezium" if debezium else "wakeline"
    publication = "wakeline"
    if getattr(args, "topology", None):
        from wakeline.topology import load_topology

        topo = load_topology(args.topology)
        topic, partitions = topo.topics.changes.name, topo.topics.changes.partitions
        slot, publication = topo.cdc.slot, topo.cdc.publication
    return {
        "topic": args.topic or topic,
        "partitions": args.partitions or partitions,
        "slot": getattr(args, "slot", None) or slot,
        "publication": getattr(args, "publication", None) or publication,
    }


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


class ProgressBar:
    """``[#####.....]  1234/5000  24%  812/s`` on one line of ``stream`` (stderr)."""

    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30,
                 every: float = 0.1) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.every = every
        self._began = time.monotonic()
        self._last = 0.0
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < self.every:
            return
        self._last = now
        frac = done / total if total else 1.0
        filled = int(frac * self.width)
        rate = done / max(now - self._began, 1e-6)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{done}/{total} {frac:4.0%} {rate:,.0f}/s")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()


def _relay(args: argparse.Namespace) -> int:
    from wakeline.cdc.relay import Relay

    s = _settings(args)
    relay = Relay(_dsn(args), _bootstrap(args), topic=s["topic"], slot=s["slot"],
                  publication=s["publication"], partitions=s["partitions"],
                  snapshot=args.snapshot, idle_sleep=args.idle_sleep)
    with relay:
        print(f"relay: slot {s['slot']} (publication {s['publication']}) -> topic "
              f"{s['topic']} on {relay.bootstrap}", flush=True)
        if args.once:
            while relay.poll_once().rows:
                pass
        else:
            relay.run_forever(_stop_on_signals())
    st = relay.stats
    print(f"relay stopped: {st.commits} commits, {st.messages} messages, "
          f"{st.failures} failures", flush=True)
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    from wakeline.cdc.relay import Relay

    s = _settings(args)
    relay = Relay(_dsn(args), _bootstrap(args), topic=s["topic"], partitions=s["partitions"],
                  slot=s["slot"])
    progress = None if args.no_progress else ProgressBar("snapshot")
    bar: Callable[[int, int], None] | None = progress
    try:
        n = relay.snapshot(workspace=args.workspace, progress=bar)
    finally:
        if progress is not None:
            progress.close()
        relay.close()
    where = f" of workspace {args.workspace}" if args.workspace else ""
    print(f"snapshot: {n} rows{where} -> {s['topic']}")
    return 0


def _connect(args: argparse.Namespace) -> int:
    from wakeline.cdc import debezium
    from wakeline.cdc._kafka import ensure_topic
    from wakeline.services import KafkaConnect
    from wakeline.services.paths import services_dir

    s = _settings(args, debezium=True)
    dsn = _dsn(args)
    config = debezium.config_from_dsn(dsn, topic=s["topic"], slot=s["slot"],
                                      publication=s["publication"], partitions=s["partitions"],
                                      snapshot_mode=args.snapshot_mode)
    if args.print_config:
        print(json.dumps({"name": args.name, "config": config}, indent=2))
        return 0
    bootstrap = _bootstrap(args)
    ensure_topic(bootstrap, s["topic"], s["partitions"])
    # Not ephemeral: the offsets file lets a restarted worker resume where it was.
    connect = KafkaConnect(bootstrap, rest_port=args.rest_port,
                           base_dir=services_dir() / "connect")
    began = time.monotonic()
    connect.up(args.timeout)
    try:
        conn = debezium.DebeziumConnector(connect, config, name=args.name)
        conn.create()
        if args.no_sentinel:
            conn.wait_running(args.timeout)
            conn.wait_slot_active(dsn, args.timeout)
        else:
            conn.wait_streaming(dsn, bootstrap, timeout=args.timeout,
                                partitions=s["partitions"])
        print(f"debezium: connector {args.name} streaming slot {s['slot']} -> {s['topic']} "
              f"on {bootstrap} ({time.monotonic() - began:.1f}s); REST {connect.rest_url}; "
              f"log {connect.log_path}", flush=True)
        stop = _stop_on_signals()
        while not stop.wait(1.0):
            if not connect.is_alive():
                print(f"error: Kafka Connect exited; log {connect.log_path}", file=sys.stderr)
                return 1
    finally:
        connect.stop()
    return 0


def _common(p: argparse.ArgumentParser, *, slot: bool = True) -> None:
    p.add_argument("--dsn", help="PostgreSQL DSN (default: $WAKELINE_PG_DSN or the running "
                                 "embedded server)")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $WAKELINE_BOOTSTRAP "
                                       "or the running broker)")
    p.add_argument("--topology", help="take topic, partitions, slot and publication from it")
    p.add_argument("--topic", help="change topic (default wakeline.changes)")
    p.add_argument("--partitions", type=int, help="partitions if the topic is created (4)")
    if slot:
        p.add_argument("--slot", help="replication slot (relay: wakeline; Debezium: "
                                      "wakeline_debezium)")
        p.add_argument("--publication", help="publication (default wakeline)")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``cdc`` command and its subcommands."""
    parser = sub.add_parser("cdc", help="PostgreSQL changes onto the change topic")
    cmds = parser.add_subparsers(dest="cdc_command", required=True)

    relay = cmds.add_parser("relay", help="run the built-in pgoutput relay (foreground)")
    _common(relay)
    relay.add_argument("--snapshot", choices=("never", "initial"), default="initial",
                       help="snapshot the tables when the slot is created (default initial)")
    relay.add_argument("--idle-sleep", type=float, default=0.02, metavar="S",
                       help="seconds between polls when idle (default 0.02)")
    relay.add_argument("--once", action="store_true",
                       help="relay what is pending now, then exit")
    relay.set_defaults(func=_relay)

    snap = cmds.add_parser("snapshot", help="write the current rows as op 'r' events")
    _common(snap, slot=False)
    snap.add_argument("--workspace", help="only this workspace")
    snap.add_argument("--no-progress", action="store_true", help="no progress bar")
    snap.set_defaults(func=_snapshot, slot=None)

    conn = cmds.add_parser("connect", help="run Kafka Connect with the Debezium connector")
    _common(conn)
    conn.add_argument("--name", default="wakeline-postgres", help="connector name")
    conn.add_argument("--rest-port", type=int, help="Connect REST port (default: free)")
    conn.add_argument("--snapshot-mode", default="initial",
                      help="Debezium snapshot.mode (default initial)")
    conn.add_argument("--timeout", type=float, default=120.0, metavar="S",
                      help="seconds to wait until streaming (default 120)")
    conn.add_argument("--no-sentinel", action="store_true",
                      help="do not write a sentinel row to prove streaming")
    conn.add_argument("--print-config", action="store_true",
                      help="print the connector configuration and exit")
    conn.set_defaults(func=_connect)
