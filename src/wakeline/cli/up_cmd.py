"""``wakeline up``: the main job on the embedded default.

Embedded PostgreSQL (data kept under ``.wakeline/embedded``), the Tansu broker
(memory only), the built-in relay, every worker role in this process, the
example catalog and a demo feeder.  It prints each run with its reasons and
each notable outcome as it happens, and stops cleanly on Ctrl-C.  Running it
again resumes where it stopped: PostgreSQL kept the truth, and the memory-only
broker is rebuilt from a PostgreSQL snapshot (the relay's slot is recreated
with an initial snapshot, cursors before records).
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from wakeline.catalog import compile_catalog
from wakeline.core.outcomes import Outcome
from wakeline.derive import RunResult
from wakeline.services import PostgresServer, TansuBroker, dsn_with_database
from wakeline.services.paths import wakeline_home
from wakeline.store import current_version, migrate
from wakeline.topology import load_topology

#: Outcomes worth a line on the console (the rest are in the outcomes table).
NOTABLE = {"cooldown", "debounce", "pending_unready", "unready_stalled", "dead", "failed",
           "missed_cron", "paused", "noop"}


def _ensure_db(server_dsn: str) -> str:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'wakeline'").fetchone() is None:
            conn.execute("CREATE DATABASE wakeline")
    return dsn_with_database(server_dsn, "wakeline")


def _drop_slot(dsn: str, slot: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE slot_name = %s AND NOT active", (slot,))


def _printer(started: float) -> tuple[Any, Any]:
    lock = threading.Lock()

    def stamp() -> str:
        return f"{time.monotonic() - started:7.1f}s"

    def on_run(r: RunResult) -> None:
        if r.outcome == "duplicate":
            return
        _, derivation, entity, _ = (r.job_id.split("/") + ["", "", "", ""])[:4]
        with lock:
            print(f"{stamp()}  run   {derivation:20} {entity:12} {r.outcome:9} "
                  f"watermark {r.watermark_before}->{r.watermark_after} "
                  f"consumed {r.records_consumed}  reasons {','.join(r.reasons)}"
                  + (f"  error {r.error_kind}: {r.error}" if r.error else ""), flush=True)

    seen: set[tuple[str | None, str, str, str]] = set()

    def on_outcome(o: Outcome) -> None:
        if str(o.kind) not in NOTABLE:
            return
        key = (o.derivation, o.entity, str(o.kind), o.reason)
        with lock:
            if key in seen:  # a condition still cooling says so once, not per record
                return
            seen.add(key)
            print(f"{stamp()}  skip  {o.derivation or '':20} {o.entity:12} {o.kind}: {o.reason}",
                  flush=True)

    return on_run, on_outcome


def _start_api(args: argparse.Namespace, topo: Any, catalog: Any, dsn: str, bootstrap: str,
               home: Path) -> Any:
    """The HTTP API and dashboard in a thread of this process.  Tokens: the operator's
    (``WAKELINE_API_TOKENS``), else one kept in ``<home>/api.yaml`` for the workspace."""
    import secrets

    import yaml

    from wakeline.api import ApiContext, ApiServer, load_settings
    from wakeline.errors import ServiceError
    from wakeline.services.ports import free_port

    settings = load_settings()
    where = "WAKELINE_API_TOKENS"
    if not settings.tokens:
        path = home / "api.yaml"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump({"tokens": {topo.workspace: secrets.token_urlsafe(24)}}))
            path.chmod(0o600)
        settings = load_settings(path)
        where = str(path)
    ctx = ApiContext(topo, catalog, dsn, bootstrap, settings=settings)
    try:
        server = ApiServer(ctx, "127.0.0.1", args.api_port).start()
    except ServiceError:  # the port is taken: any free one will do for a local run
        server = ApiServer(ctx, "127.0.0.1", free_port()).start()
    print(f"api       {server.url}  (dashboard {server.url}/dashboard, OpenAPI "
          f"{server.url}/docs; workspace tokens in {where})", flush=True)
    return server


def run(args: argparse.Namespace) -> int:
    from wakeline.streams.app import Runtime
    from wakeline.streams.demo import DemoFeeder
    from wakeline.streams.worker import run_worker

    topo = load_topology(args.topology)
    catalog = compile_catalog(args.catalog or topo.catalog)
    started = time.monotonic()
    home = wakeline_home() / "embedded"
    pg = PostgresServer(base_dir=home / "postgres", data_dir=home / "postgres" / "data")
    broker = TansuBroker(base_dir=home / "tansu", ephemeral=True)
    feeder: DemoFeeder | None = None
    api: Any = None
    try:
        pg.up(args.timeout)
        broker.up(args.timeout)
        dsn = _ensure_db(pg.dsn)
        applied = migrate(dsn)
        _drop_slot(dsn, topo.cdc.slot)  # the broker is new: snapshot PostgreSQL into it
        print(f"postgres  {dsn}  (schema v{current_version(dsn)}, {len(applied)} applied now)")
        print(f"broker    {broker.bootstrap}  (Tansu, memory storage)")
        print(f"catalog   {Path(args.catalog or topo.catalog).resolve()}  {catalog.hash[:19]}  "
              f"{len(catalog.triggers)} triggers: {', '.join(sorted(catalog.triggers))}")
        if not args.no_api:
            api = _start_api(args, topo, catalog, dsn, broker.bootstrap, home)
        on_run, on_outcome = _printer(started)
        rt = Runtime(topo, catalog, dsn, broker.bootstrap, on_run=on_run,
                     on_outcome=on_outcome)
        if not args.no_feeder:
            feeder = DemoFeeder(dsn, catalog, seed=args.seed)

        def on_started(app: Any) -> None:
            print(f"{time.monotonic() - started:7.1f}s  ready: relay, conditions, derive, "
                  "cron running — Ctrl-C stops", flush=True)
            if feeder is not None:
                feeder.start()
            if args.duration:
                threading.Timer(args.duration, lambda: signal.raise_signal(signal.SIGINT)).start()

        run_worker(rt, relay=True, on_started=on_started)
    except SystemExit as exc:  # the Faust worker exits through sys.exit
        if exc.code not in (0, None):
            raise
    finally:
        if feeder is not None:
            feeder.stop()
            print(f"feeder wrote {feeder.written} records", flush=True)
        if api is not None:
            api.stop()
        broker.stop()
        pg.stop()
        print("stopped; run `make up` again to resume", flush=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("up", help="run the main job on the embedded default")
    p.add_argument("--topology", default="topologies/embedded.yaml")
    p.add_argument("--catalog", default=None, help="catalog directory (default: the topology's)")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--duration", type=float, default=None,
                   help="stop by itself after this many seconds (default: run until Ctrl-C)")
    p.add_argument("--no-feeder", action="store_true", help="do not write demo records")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--api-port", type=int, default=8000,
                   help="the HTTP API and dashboard (a free port when taken)")
    p.add_argument("--no-api", action="store_true", help="do not serve the HTTP API")
    p.set_defaults(func=run)
