"""``wakeline services up|status|down|fetch``: the local PostgreSQL and broker.

``up`` starts PostgreSQL and a Kafka-protocol broker detached (they outlive the
command), records them in ``<WAKELINE_HOME>/services/state.json`` and prints
their addresses; running it again reuses what is already running. ``status``
probes each; ``down`` stops them all. ``fetch`` downloads the Kafka jars and
installs Debian's Chromium when it is missing (as root; the dashboard test needs it).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from wakeline.errors import ConfigError
from wakeline.services import (
    ExternalKafka,
    ExternalPostgres,
    KafkaBroker,
    PostgresServer,
    TansuBroker,
    ensure_jars,
    find_tansu,
    state,
)
from wakeline.services.base import Service
from wakeline.services.paths import services_dir
from wakeline.services.postgres import redact_dsn

BROKERS = ("tansu", "kafka")


def _running(record: state.Record | None) -> bool:
    # External services are trusted to exist; status probes them.
    return record is not None and state.is_alive(record) is not False


def _postgres(args: argparse.Namespace) -> Service:
    if args.pg_dsn:
        return ExternalPostgres(args.pg_dsn)
    port = args.pg_port or state.port_if_free(state.last_ports().get("postgres"))
    return PostgresServer(port=port, base_dir=services_dir() / "postgres")


def _broker(args: argparse.Namespace) -> Service:
    if args.bootstrap:
        return ExternalKafka(args.bootstrap)
    port = args.broker_port or state.port_if_free(state.last_ports().get(f"broker.{args.broker}"))
    if args.broker == "kafka":
        return KafkaBroker(port=port, base_dir=services_dir() / "kafka")
    return TansuBroker(port=port, base_dir=services_dir() / "tansu")


def _wanted_kind(role: str, args: argparse.Namespace) -> str:
    if role == "postgres":
        return "external" if args.pg_dsn else "embedded"
    return "external" if args.bootstrap else str(args.broker)


def _describe(role: str, rec: state.Record) -> str:
    addr = redact_dsn(rec["dsn"]) if rec.get("dsn") else rec.get("bootstrap") or "?"
    parts = [f"{role:<9} {rec.get('kind', '?'):<9} {addr}"]
    if rec.get("pid"):
        parts.append(f"pid {rec['pid']}")
    if rec.get("log"):
        parts.append(f"log {rec['log']}")
    return "  ".join(parts)


def _up(args: argparse.Namespace) -> int:
    makers = {"postgres": _postgres, "broker": _broker}
    with state.locked():
        records = state.load()
        for role, make in makers.items():
            rec = records.get(role)
            if _running(rec):
                assert rec is not None
                wanted = _wanted_kind(role, args)
                if rec.get("kind") != wanted:
                    raise ConfigError(
                        f"{role} is already up as {rec.get('kind')!r}, not {wanted!r}: "
                        "run `wakeline services down` first",
                        role=role,
                    )
                print(f"already running: {_describe(role, rec)}")
                continue
            service = make(args)
            service.start()
            try:
                service.wait_ready(args.timeout)
            except BaseException:
                service.stop()
                raise
            rec = service.record()
            records[role] = rec
            # Saved after each start so a later failure still leaves `down` able
            # to stop what did start.
            state.save(records)
            port = rec.get("port")
            if rec.get("managed") and port:
                key = "postgres" if role == "postgres" else f"broker.{rec['kind']}"
                state.remember_port(key, int(port))
            print(f"started: {_describe(role, rec)}")
        if getattr(args, "cdc", "none") == "debezium":
            _up_debezium(args, records)
    return 0


def _up_debezium(args: argparse.Namespace, records: dict[str, Any]) -> None:
    """Kafka Connect (detached) with the project's Debezium connector on the running
    PostgreSQL; the schema is applied first (the connector reads its publication)."""
    from wakeline.cdc import debezium
    from wakeline.cdc._kafka import ensure_topic
    from wakeline.services import KafkaConnect
    from wakeline.services.paths import services_dir
    from wakeline.store import migrate

    if records.get("broker", {}).get("kind") not in ("kafka", "external"):
        raise ConfigError("--cdc debezium needs Apache Kafka: `wakeline services up "
                          "--broker kafka --cdc debezium` (or use the relay with Tansu)")
    if _running(records.get("connect")):
        print(f"already running: {_describe('connect', records['connect'])}")
        return
    dsn = str(records["postgres"]["dsn"])
    bootstrap = str(records["broker"]["bootstrap"])
    migrate(dsn)
    ensure_topic(bootstrap, "wakeline.changes", 8)
    connect = KafkaConnect(bootstrap, base_dir=services_dir() / "connect")
    connect.start()
    try:
        connect.wait_ready(args.timeout)
        conn = debezium.DebeziumConnector(connect, debezium.config_from_dsn(
            dsn, topic="wakeline.changes", slot="wakeline_debezium", publication="wakeline",
            partitions=8), name="wakeline-postgres")
        conn.create()
        conn.wait_running(args.timeout)
    except BaseException:
        connect.stop()
        raise
    records["connect"] = connect.record()
    state.save(records)
    print(f"started: {_describe('connect', records['connect'])}")


def _status(args: argparse.Namespace) -> int:
    records = state.load()
    rows: list[dict[str, Any]] = []
    for role, rec in records.items():
        alive = state.is_alive(rec)
        ready = state.is_ready(rec) if alive is not False else False
        rows.append({"role": role, **rec, "alive": alive, "ready": ready})
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    elif not rows:
        print("no services running (start them with `wakeline services up`)")
    for row in rows if not args.json else []:
        liveness = {True: "alive", False: "dead", None: "external"}[row["alive"]]
        readiness = "ready" if row["ready"] else "NOT READY"
        print(f"{_describe(row['role'], row)}  {liveness}  {readiness}")
    return 0 if rows and all(r["ready"] for r in rows) else 1


def _down(args: argparse.Namespace) -> int:
    with state.locked():
        records = state.load()
        # The broker first: nothing that talks to PostgreSQL outlives it then.
        for role in sorted(records, key=lambda r: {"connect": 0, "postgres": 2}.get(r, 1)):
            rec = records.pop(role)
            state.stop(rec, timeout=args.timeout)
            print(f"stopped: {role} ({rec.get('kind')})")
            state.save(records)
    if not records:
        state.save({})
    return 0


def _fetch(args: argparse.Namespace) -> int:
    dist = ensure_jars()
    print(f"kafka libs: {dist.libs}")
    print(f"connect plugins: {dist.plugins}")
    print(f"tansu: {find_tansu()}")
    from wakeline.services.chromium import ensure_chromium

    print(f"chromium: {ensure_chromium()}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``services`` command and its subcommands."""
    parser = sub.add_parser("services", help="run the local PostgreSQL and Kafka broker")
    cmds = parser.add_subparsers(dest="services_command", required=True)

    up = cmds.add_parser("up", help="start PostgreSQL and a broker (detached)")
    up.add_argument("--broker", choices=BROKERS, default="tansu",
                    help="tansu (embedded, no JVM; default) or kafka (Apache Kafka, Java 17)")
    up.add_argument("--pg-dsn", metavar="DSN", help="use this PostgreSQL instead of starting one")
    up.add_argument("--cdc", choices=("none", "debezium"), default="none",
                    help="also run Kafka Connect with the Debezium connector (needs --broker "
                         "kafka); the relay needs no service: `wakeline cdc relay`")
    up.add_argument("--bootstrap", metavar="SERVERS",
                    help="use this Kafka cluster instead of starting a broker")
    up.add_argument("--pg-port", type=int, help="PostgreSQL port (default: last one, or free)")
    up.add_argument("--broker-port", type=int, help="broker port (default: last one, or free)")
    up.add_argument("--timeout", type=float, default=120.0, metavar="S",
                    help="seconds to wait for each service to be ready (default 120)")
    up.set_defaults(func=_up)

    status = cmds.add_parser("status", help="show each service, alive and ready")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)

    down = cmds.add_parser("down", help="stop the services started by `up`")
    down.add_argument("--timeout", type=float, default=30.0, metavar="S",
                      help="seconds to wait for a clean stop before killing (default 30)")
    down.set_defaults(func=_down)

    fetch = cmds.add_parser("fetch", help="download the Kafka jars and Debezium plugin, and "
                                          "install Chromium (the dashboard test) when root")
    fetch.set_defaults(func=_fetch)
