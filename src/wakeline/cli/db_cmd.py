"""``wakeline db migrate|version``: apply the schema to a PostgreSQL database."""

from __future__ import annotations

import argparse
import os

from wakeline.errors import ConfigError
from wakeline.store import current_version, migrate


def _dsn(args: argparse.Namespace) -> str:
    dsn = args.dsn or os.environ.get("WAKELINE_PG_DSN")
    if not dsn:
        from wakeline.services import state

        running = state.load().get("postgres")
        dsn = running.get("dsn") if running else None
    if not dsn:
        raise ConfigError(
            "no database: pass --dsn, set WAKELINE_PG_DSN, or start the embedded "
            "PostgreSQL with `wakeline services up`"
        )
    return str(dsn)


def _migrate(args: argparse.Namespace) -> int:
    applied = migrate(_dsn(args))
    for mig in applied:
        print(f"applied {mig.version:04d}_{mig.name}")
    print(f"schema at version {current_version(_dsn(args))}" + ("" if applied else " (up to date)"))
    return 0


def _version(args: argparse.Namespace) -> int:
    print(current_version(_dsn(args)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    db = sub.add_parser("db", help="database schema")
    dbsub = db.add_subparsers(dest="db_command", required=True)
    for name, func, text in (("migrate", _migrate, "apply pending migrations"),
                             ("version", _version, "print the applied schema version")):
        p = dbsub.add_parser(name, help=text)
        p.add_argument("--dsn", help="PostgreSQL DSN (default: WAKELINE_PG_DSN or the running embedded server)")
        p.set_defaults(func=func)
