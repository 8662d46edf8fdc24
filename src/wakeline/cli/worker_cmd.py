"""``wakeline worker --topology FILE --role ROLE``: deploy a worker process."""

from __future__ import annotations

import argparse
import os

from wakeline.catalog import compile_catalog
from wakeline.clock import clock_from_env
from wakeline.errors import ConfigError
from wakeline.topology import load_topology

ROLE_CHOICES = ("all", "readiness", "conditions", "derive", "cron")


def _addresses(args: argparse.Namespace, topo) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    dsn = args.dsn or os.environ.get("WAKELINE_PG_DSN") or topo.postgres.dsn
    bootstrap = args.bootstrap or os.environ.get("WAKELINE_BOOTSTRAP") or topo.broker.bootstrap
    if not dsn or not bootstrap:
        from wakeline.services import state

        running = state.load()
        dsn = dsn or (running.get("postgres") or {}).get("dsn")
        bootstrap = bootstrap or (running.get("broker") or {}).get("bootstrap")
    if not dsn or not bootstrap:
        raise ConfigError("no database or broker address: pass --dsn and --bootstrap, set "
                          "WAKELINE_PG_DSN / WAKELINE_BOOTSTRAP, or `wakeline services up`")
    return str(dsn), str(bootstrap)


def run(args: argparse.Namespace) -> int:
    from wakeline.streams.app import ROLES, Runtime
    from wakeline.streams.worker import run_worker

    _default_roles(args)
    topo = load_topology(args.topology)
    dsn, bootstrap = _addresses(args, topo)
    roles = ROLES if "all" in args.role else tuple(args.role)
    rt = Runtime(topo, compile_catalog(args.catalog or topo.catalog), dsn, bootstrap,
                 roles=roles, app_id=args.app_id, announce=True, clock=clock_from_env(),
                 stats_interval=float(os.environ.get("WAKELINE_STATS_INTERVAL") or 0) or None,
                 on_run=(lambda r: print(f"run {r.job_id} {r.outcome} "
                                         f"wm {r.watermark_before}->{r.watermark_after}",
                                         flush=True)) if args.print_runs else None)
    run_worker(rt, relay=args.relay, loglevel=args.loglevel)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("worker", help="run a worker for a topology's roles")
    p.add_argument("--topology", required=True)
    p.add_argument("--role", action="append", choices=ROLE_CHOICES, default=None,
                   help="repeatable; default all")
    p.add_argument("--catalog", default=None)
    p.add_argument("--dsn", default=None)
    p.add_argument("--bootstrap", default=None)
    p.add_argument("--app-id", default=None, help="consumer group prefix (default wakeline-<topology>)")
    p.add_argument("--relay", action="store_true", help="also run the built-in CDC relay")
    p.add_argument("--print-runs", action="store_true")
    p.add_argument("--loglevel", default="warn", choices=("crit", "error", "warn", "info", "debug"))
    p.set_defaults(func=run, role=None)


def _default_roles(args: argparse.Namespace) -> None:
    if args.role is None:
        args.role = ["all"]
