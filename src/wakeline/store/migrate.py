"""Versioned, idempotent schema migrations.

Migrations are the ``migrations/NNNN_name.sql`` files shipped in this package,
applied in order inside one transaction each, under an advisory lock so two
processes migrating at once serialize.  Applied versions are recorded with a
checksum; re-running is a no-op, and an applied file that was edited since is an
error (a migration is immutable once applied).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from wakeline.errors import StoreError

_LOCK_KEY = 0x5741_4B45  # "WAKE"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationChecksumMismatch(StoreError):
    code = "store.migration_checksum"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available() -> list[Migration]:
    """Every migration shipped with this package, in version order."""
    found = []
    for entry in resources.files("wakeline.store").joinpath("migrations").iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    return sorted(found, key=lambda mig: mig.version)


def migrate(dsn: str) -> list[Migration]:
    """Apply every pending migration; return the ones applied by this call."""
    applied_now: list[Migration] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS wakeline_migrations (
                       version integer PRIMARY KEY, name text NOT NULL,
                       checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            rows = conn.execute("SELECT version, checksum FROM wakeline_migrations").fetchall()
            done = {int(v): c for v, c in rows}
            for mig in available():
                if mig.version in done:
                    if done[mig.version] != mig.checksum:
                        raise MigrationChecksumMismatch(
                            f"migration {mig.version:04d}_{mig.name} was edited after it was "
                            "applied; add a new migration instead of changing an applied one",
                            version=mig.version,
                        )
                    continue
                with conn.transaction():
                    conn.execute(mig.sql)  # type: ignore[arg-type]
                    conn.execute(
                        "INSERT INTO wakeline_migrations (version, name, checksum) "
                        "VALUES (%s, %s, %s)",
                        (mig.version, mig.name, mig.checksum),
                    )
                applied_now.append(mig)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now


def current_version(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('wakeline_migrations')").fetchone()
        if not exists or exists[0] is None:
            return 0
        row = conn.execute("SELECT coalesce(max(version), 0) FROM wakeline_migrations").fetchone()
        return int(row[0]) if row else 0
