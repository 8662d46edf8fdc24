"""``wakeline up``: the main job on the embedded default.

Starts embedded PostgreSQL (data kept under ``.wakeline/embedded``) and the Tansu
broker, applies the schema, compiles the catalog, creates the topology's topics
and prints the normalized triggers.  Later issues grow this into the whole
pipeline (relay, agents, derive workers, a demo feeder).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from wakeline.catalog import compile_catalog
from wakeline.services import PostgresServer, TansuBroker
from wakeline.services.paths import wakeline_home
from wakeline.store import current_version, migrate
from wakeline.topology import load_topology


def _describe(cond: dict) -> str:
    kind = cond["kind"]
    parts = []
    for key in ("metric", "threshold", "comparison", "after_s", "max_wait_s", "field",
                "offset_s", "expr", "entities", "keys", "transitions", "first_record",
                "total_records", "window"):
        if key in cond and cond[key] not in (None, False, ()):
            value = cond[key]
            if key == "field" and isinstance(value, dict):
                value = value["name"]
            if key == "metric" and isinstance(value, dict):
                value = value.get("scorer") or value.get("path") or value.get("kind")
                value = f"{cond['metric']['aggregate']}({value})"
            parts.append(f"{key}={value}")
    scope = cond.get("scope")
    if scope:
        parts.insert(0, "scope=" + ",".join(c["collection"] for c in scope["collections"]))
    return f"{kind}({', '.join(parts)})"


def run(args: argparse.Namespace) -> int:
    topo = load_topology(args.topology)
    catalog_dir = args.catalog or topo.catalog
    started = time.monotonic()
    home = wakeline_home() / "embedded"
    pg = PostgresServer(base_dir=home / "postgres", data_dir=home / "postgres" / "data")
    broker = TansuBroker(base_dir=home / "tansu", ephemeral=True)
    try:
        pg.start()
        broker.start()
        pg.wait_ready(timeout=args.timeout)
        broker.wait_ready(timeout=args.timeout)
        dsn = pg.create_database("wakeline") if not _has_db(pg.dsn) else _db_dsn(pg.dsn)
        applied = migrate(dsn)
        print(f"postgres  {dsn}  (schema v{current_version(dsn)}, {len(applied)} applied now)")
        print(f"broker    {broker.bootstrap}  (Tansu, memory storage)")
        _create_topics(broker.bootstrap, topo)
        catalog = compile_catalog(catalog_dir)
        data = catalog.to_dict()
        print(f"catalog   {Path(catalog_dir).resolve()}  {catalog.hash[:19]}  "
              f"{len(catalog.collections)} collections, {len(catalog.derivations)} derivations, "
              f"{len(catalog.triggers)} triggers")
        print()
        for name, trig in data["triggers"].items():
            print(f"  {name:28} -> {trig['derivation']:22} {trig['hash'][:19]}")
            for cond in trig["conditions"]:
                print(f"      {_describe(cond)}")
            pacing = {k: trig[k] for k in ("cooldown_s", "debounce_s", "max_wait_s") if trig.get(k)}
            if pacing:
                print(f"      pacing {pacing}")
        print(f"\nready in {time.monotonic() - started:.1f}s")
        if args.keep:
            print("services keep running; Ctrl-C stops them")
            while True:
                time.sleep(3600)
    finally:
        broker.stop()
        pg.stop()
    return 0


def _db_dsn(server_dsn: str) -> str:
    from wakeline.services import dsn_with_database

    return dsn_with_database(server_dsn, "wakeline")


def _has_db(server_dsn: str) -> bool:
    import psycopg

    with psycopg.connect(server_dsn, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = 'wakeline'").fetchone() \
            is not None


def _create_topics(bootstrap: str, topo) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    specs = [topo.topics.changes, topo.topics.stimuli, topo.topics.derive, topo.topics.dead_letter]
    futures = admin.create_topics([NewTopic(t.name, t.partitions, 1) for t in specs])
    for name, fut in futures.items():
        try:
            fut.result(timeout=15)
        except Exception as exc:  # an existing topic is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    listed = admin.list_topics(timeout=10).topics
    print("topics    " + ", ".join(f"{t.name}[{len(listed[t.name].partitions)}]" for t in specs))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("up", help="run the main job on the embedded default")
    p.add_argument("--topology", default="topologies/embedded.yaml")
    p.add_argument("--catalog", default=None, help="catalog directory (default: the topology's)")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--keep", action="store_true", help="keep the services running until Ctrl-C")
    p.set_defaults(func=run)
