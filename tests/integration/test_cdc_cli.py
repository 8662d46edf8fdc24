"""``wakeline cdc relay|snapshot|connect`` as subprocesses, against real services."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fixtures.cdc import read_workspace, write_markers
from wakeline.cdc import parse
from wakeline.store import Store, migrate

pytestmark = pytest.mark.integration

# The command alone (the lead wires it into wakeline.cli.main's COMMANDS).
_CLI = (
    "import argparse, sys\n"
    "from wakeline.cli import cdc_cmd\n"
    "from wakeline.errors import WakelineError\n"
    "p = argparse.ArgumentParser(); s = p.add_subparsers(required=True)\n"
    "cdc_cmd.register(s)\n"
    "a = p.parse_args(sys.argv[1:])\n"
    "try:\n"
    "    sys.exit(a.func(a))\n"
    "except WakelineError as e:\n"
    "    print(f'error[{e.code}]: {e}', file=sys.stderr); sys.exit(2)\n"
)


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "WAKELINE_HOME": str(home)}


def _run(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _CLI, *args], capture_output=True, text=True,
                          env=_env(home), timeout=timeout)


@pytest.fixture
def cdc_db(pg_dsn: str) -> Any:
    migrate(pg_dsn)
    yield pg_dsn
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for _ in range(50):
            if not conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = "
                                "current_database() AND active").fetchone()[0]:  # type: ignore[index]
                break
            time.sleep(0.1)
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE database = current_database() AND NOT active")


def test_relay_once_and_snapshot_with_progress(cdc_db: str, kafka_broker: Any,
                                               topic_name: str, tmp_path: Path) -> None:
    store = Store.connect(cdc_db)
    try:
        seq = store.insert_record(workspace="cli", entity="user:a", collection="main",
                                  ready=True)
        common = ["--dsn", cdc_db, "--bootstrap", kafka_broker.bootstrap, "--topic", topic_name]
        done = _run(tmp_path, "cdc", "relay", *common, "--slot", "cli", "--once")
        assert done.returncode == 0, done.stderr
        assert f"-> topic {topic_name}" in done.stdout
        store.mark_ready([seq])  # already ready: no change; and one real change:
        store.insert_record(workspace="cli", entity="user:b", collection="main")
        again = _run(tmp_path, "cdc", "relay", *common, "--slot", "cli", "--once")
        assert again.returncode == 0, again.stderr
        snap = _run(tmp_path, "cdc", "snapshot", *common, "--workspace", "cli")
        assert snap.returncode == 0, snap.stderr
        assert "snapshot: 2 rows of workspace cli" in snap.stdout
        assert "snapshot [" in snap.stderr and "2/2 100%" in snap.stderr
        markers = write_markers(cdc_db, "cli", 4)
        final = _run(tmp_path, "cdc", "relay", *common, "--slot", "cli", "--once")
        assert final.returncode == 0, final.stderr
    finally:
        store.close()
    evs = [parse(m.value, m.key) for m in
           read_workspace(kafka_broker.bootstrap, topic_name, "cli", until=markers)]
    ops: dict[str, list[str]] = {}
    for e in evs:
        if not e.entity.startswith("__end__"):  # type: ignore[union-attr]
            ops.setdefault(e.entity, []).append(e.op)  # type: ignore[union-attr]
    # The first run's snapshot (slot created: --snapshot initial), the stream,
    # then the explicit snapshot.
    assert ops == {"user:a": ["r", "r"], "user:b": ["c", "r"]}


def test_missing_addresses_and_print_config(tmp_path: Path) -> None:
    env_free = {k: v for k, v in os.environ.items()
                if k not in ("WAKELINE_PG_DSN", "WAKELINE_BOOTSTRAP")}
    out = subprocess.run([sys.executable, "-c", _CLI, "cdc", "snapshot"], capture_output=True,
                         text=True, env={**env_free, "WAKELINE_HOME": str(tmp_path)}, timeout=60)
    assert out.returncode == 2 and "no database: pass --dsn" in out.stderr
    cfg = _run(tmp_path, "cdc", "connect", "--dsn", "postgresql://u:p@h:5/db", "--print-config")
    assert cfg.returncode == 0, cfg.stderr
    body = json.loads(cfg.stdout)
    assert body["name"] == "wakeline-postgres"
    assert body["config"]["database.hostname"] == "h"
    assert body["config"]["slot.name"] == "wakeline_debezium"


def test_connect_runs_debezium_until_interrupted(cdc_db: str, kafka_broker: Any,
                                                 topic_name: str) -> None:
    home = Path(tempfile.mkdtemp(prefix="wl-cdc-cli-"))
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, "cdc", "connect", "--dsn", cdc_db, "--bootstrap",
         kafka_broker.bootstrap, "--topic", topic_name, "--slot", "cli_dbz",
         "--name", f"cli-{topic_name}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(home))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "streaming slot cli_dbz" not in line:
            proc.kill()
            raise AssertionError(f"no streaming line: {line!r}\n{proc.stderr.read()}")  # type: ignore[union-attr]
        with psycopg.connect(cdc_db, autocommit=True) as conn:
            conn.execute("INSERT INTO records (workspace, entity, collection) VALUES "
                         "('cli', 'user:z', 'main')")
        markers = write_markers(cdc_db, "cli", 4)
        msgs = read_workspace(kafka_broker.bootstrap, topic_name, "cli", until=markers)
        assert any(parse(m.value, m.key).entity == "user:z" for m in msgs)  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
        shutil.rmtree(home, ignore_errors=True)
    assert rc == 0
