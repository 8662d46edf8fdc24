"""The services layer against real processes: PostgreSQL, Kafka, Tansu, Connect, CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from wakeline.errors import PrerequisiteMissing
from wakeline.services import KafkaBroker, PostgresServer, TansuBroker
from wakeline.services.ports import port_is_open
from wakeline.services.postgres import bin_dir
from wakeline.services.process import descendants, pid_alive

pytestmark = pytest.mark.integration


# --- PostgreSQL ---------------------------------------------------------------


def test_postgres_is_logical_and_reachable(pg_server: PostgresServer) -> None:
    with psycopg.connect(pg_server.dsn) as conn:
        settings: dict[str, str] = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
            (["wal_level", "max_replication_slots", "max_wal_senders"],),
        ).fetchall())
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert settings["wal_level"] == "logical"
    assert int(settings["max_replication_slots"]) >= 10
    assert int(settings["max_wal_senders"]) >= 10


def test_logical_decoding_with_pgoutput(pg_dsn: str) -> None:
    """What the CDC relay and Debezium rely on: a pgoutput slot decodes a commit."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute("INSERT INTO t VALUES (1)")
        changes = conn.execute(
            "SELECT count(*) FROM pg_logical_slot_get_binary_changes("
            "'s', NULL, NULL, 'proto_version', '1', 'publication_names', 'p')"
        ).fetchone()
        conn.execute("SELECT pg_drop_replication_slot('s')")
    assert changes is not None and changes[0] >= 3  # BEGIN, RELATION, INSERT, COMMIT


def test_replication_connections_are_trusted(pg_server: PostgresServer) -> None:
    """Debezium connects with replication=database: pg_hba must allow it on TCP."""
    out = subprocess.run(
        [str(bin_dir() / "psql"), pg_server.dsn + "?replication=database", "-XAtc",
         "IDENTIFY_SYSTEM"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("|") == 3  # systemid|timeline|xlogpos|dbname


def test_create_database_returns_a_working_dsn(pg_server: PostgresServer) -> None:
    dsn = pg_server.create_database("wl_smoke_create")
    try:
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("wl_smoke_create",)
    finally:
        pg_server.drop_database("wl_smoke_create")
    with psycopg.connect(pg_server.dsn) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = 'wl_smoke_create'"
        ).fetchone() == (0,)


def test_pg_dsn_is_a_fresh_database(pg_dsn: str, pg_server: PostgresServer) -> None:
    with psycopg.connect(pg_dsn) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
    assert name is not None and name[0].startswith("t_")
    assert tables == (0,)


def test_second_postgres_on_its_own_port_stops_without_leftovers() -> None:
    root = Path(tempfile.mkdtemp(prefix="wakeline-pg2-"))
    root.chmod(0o755)
    server = PostgresServer(base_dir=root, ephemeral=True).up(60)
    try:
        assert port_is_open(server.port)
        assert server.pid is not None
        family = descendants(server.pid)
        assert family, "postmaster should have background workers"
        pid = server.pid
    finally:
        server.stop()
    assert not pid_alive(pid)
    assert not [p for p, ticks in family if pid_alive(p, ticks)]
    assert not port_is_open(server.port)
    assert not root.exists()


# --- Kafka-protocol brokers ---------------------------------------------------

N_MESSAGES = 200


def _roundtrip(bootstrap: str, topic: str, group: str) -> list[tuple[bytes, bytes]]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent = [(f"k{i % 7}".encode(), f"v{i}".encode()) for i in range(N_MESSAGES)]
    for key, value in sent:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        # Tansu answers JoinGroup after half the session timeout: keep it short.
        "session.timeout.ms": 6000,
    })
    got: list[tuple[bytes, bytes]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(got) < N_MESSAGES and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                continue
            got_key, got_value = msg.key(), msg.value()
            assert isinstance(got_key, bytes) and isinstance(got_value, bytes)
            got.append((got_key, got_value))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert sorted(got) == sorted(sent)  # every message, once
    for key in {k for k, _ in sent}:  # and in order per key (one partition per key)
        assert [v for k, v in got if k == key] == [v for k, v in sent if k == key]
    return got


@pytest.mark.parametrize("broker", ["kafka_broker", "tansu_broker"])
def test_produce_and_consume_with_a_group(
    broker: str, topic_name: str, group_id: str, request: pytest.FixtureRequest
) -> None:
    service = request.getfixturevalue(broker)
    _roundtrip(service.bootstrap, topic_name, group_id)


def test_second_tansu_gets_a_free_port_and_stops_cleanly(tansu_broker: TansuBroker) -> None:
    other = TansuBroker(ephemeral=True, base_dir=Path(tempfile.mkdtemp(prefix="wl-tansu-")))
    other.up(30)
    pid = other.pid
    try:
        assert other.port != getattr(tansu_broker, "port", None)
        assert port_is_open(other.port)
        assert other.is_ready()  # a metadata request on its own port
    finally:
        other.stop()
    assert pid is not None and not pid_alive(pid)
    assert not port_is_open(other.port)
    other.stop()  # idempotent


def test_missing_java_is_a_clear_prerequisite_error(tmp_path: Path) -> None:
    broker = KafkaBroker(java_home=str(tmp_path / "no-jdk"), base_dir=tmp_path / "kafka")
    with pytest.raises(PrerequisiteMissing) as info:
        broker.up(10)
    assert "Java 17 not found" in str(info.value)
    assert "--broker tansu" in str(info.value)
    assert broker.pid is None  # nothing was spawned


# --- Kafka Connect ------------------------------------------------------------


def test_connect_lists_the_debezium_postgres_plugin(kafka_connect: object) -> None:
    plugins = kafka_connect.connector_plugins()  # type: ignore[attr-defined]
    classes = {p["class"] for p in plugins}
    assert "io.debezium.connector.postgresql.PostgresConnector" in classes


# --- CLI ----------------------------------------------------------------------

_CLI = (
    "import argparse, sys\n"
    "from wakeline.cli import services_cmd\n"
    "p = argparse.ArgumentParser(); s = p.add_subparsers(required=True)\n"
    "services_cmd.register(s)\n"
    "a = p.parse_args(sys.argv[1:])\n"
    "sys.exit(a.func(a))\n"
)


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A separate process, so `up` really exits while its services keep running.
    env = {**os.environ, "WAKELINE_HOME": str(home)}
    return subprocess.run([sys.executable, "-c", _CLI, *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_cli_up_is_detached_idempotent_and_down_stops_all() -> None:
    home = Path(tempfile.mkdtemp(prefix="wakeline-cli-"))
    home.chmod(0o755)
    try:
        first = _cli(home, "services", "up", "--broker", "tansu")
        assert first.returncode == 0, first.stderr
        state = json.loads((home / "services" / "state.json").read_text())
        pids = {role: rec["pid"] for role, rec in state.items()}
        assert set(pids) == {"postgres", "broker"}
        assert all(pid_alive(p) for p in pids.values())

        again = _cli(home, "services", "up", "--broker", "tansu")
        assert again.returncode == 0, again.stderr
        assert again.stdout.count("already running") == 2
        state2 = json.loads((home / "services" / "state.json").read_text())
        assert {role: rec["pid"] for role, rec in state2.items()} == pids

        status = _cli(home, "services", "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        rows = json.loads(status.stdout)
        assert {r["role"]: (r["alive"], r["ready"]) for r in rows} == {
            "postgres": (True, True), "broker": (True, True)}

        down = _cli(home, "services", "down")
        assert down.returncode == 0, down.stderr
        assert not any(pid_alive(p) for p in pids.values())
        assert not (home / "services" / "state.json").exists()
        assert _cli(home, "services", "status").returncode == 1
    finally:
        _cli(home, "services", "down")
        shutil.rmtree(home, ignore_errors=True)


def test_kafka_formats_with_a_cluster_id_that_starts_with_a_dash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 in 64 random ids starts with '-', which argparse once took for a flag."""
    import wakeline.services.kafka as kafka_mod

    monkeypatch.setattr(kafka_mod, "new_cluster_id", lambda: "-Ab1234567890123456789")
    broker = KafkaBroker(base_dir=tmp_path / "kafka", ephemeral=True)
    try:
        broker.up(60)
        assert "-Ab1234567890123456789" in (broker.data_dir / "meta.properties").read_text()
    finally:
        broker.stop()


def test_cli_up_with_debezium_then_down_leaves_nothing(tmp_path: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="wl-dbz-"))
    home.chmod(0o755)  # PostgreSQL runs unprivileged when we are root
    env = {**os.environ, "WAKELINE_HOME": str(home)}
    cli = [sys.executable, "-m", "wakeline.cli.main", "services"]
    try:
        up = subprocess.run([*cli, "up", "--broker", "kafka", "--cdc", "debezium"], env=env,
                            capture_output=True, text=True, timeout=240)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "started: connect" in up.stdout
        status = subprocess.run([*cli, "status", "--json"], env=env, capture_output=True,
                                text=True, timeout=60)
        rows = {r["role"]: r for r in json.loads(status.stdout)}
        assert rows["connect"]["ready"] and rows["broker"]["kind"] == "kafka"
        bad = subprocess.run([*cli, "up", "--cdc", "debezium"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert bad.returncode == 2  # already up as kafka, asked for tansu
    finally:
        subprocess.run([*cli, "down"], env=env, capture_output=True, text=True, timeout=120)
        left = subprocess.run(["pgrep", "-f", str(home)], capture_output=True, text=True)
        shutil.rmtree(home, ignore_errors=True)
    assert left.stdout.strip() == ""
