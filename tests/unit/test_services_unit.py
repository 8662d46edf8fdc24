"""The services layer without services: paths, ports, discovery, process control, CLI."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
from pathlib import Path
from typing import ClassVar

import pytest

import wakeline.services as services
from wakeline.cli import services_cmd
from wakeline.errors import PrerequisiteMissing, ServiceError, ServiceTimeout
from wakeline.services import maven, paths, state
from wakeline.services.base import ProcessService
from wakeline.services.connect import KafkaConnect
from wakeline.services.kafka import KafkaBroker, new_cluster_id
from wakeline.services.ports import free_port, free_ports, port_is_open
from wakeline.services.postgres import PostgresServer, dsn_with_database
from wakeline.services.process import ProcessHandle, descendants, pid_alive
from wakeline.services.tansu import TansuBroker, find_tansu

# --- public surface -----------------------------------------------------------


def test_exports_are_sorted_and_importable() -> None:
    assert services.__all__ == sorted(services.__all__)
    for name in services.__all__:
        assert getattr(services, name) is not None


# --- paths --------------------------------------------------------------------


def test_home_and_cache_follow_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("WAKELINE_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert paths.wakeline_home() == tmp_path.resolve() / ".wakeline"
    monkeypatch.setenv("WAKELINE_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("WAKELINE_CACHE", str(tmp_path / "c"))
    assert paths.services_dir() == (tmp_path / "h" / "services").resolve()
    assert paths.cache_dir() == (tmp_path / "c").resolve()


def test_pom_is_found_from_the_package_whatever_the_cwd(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("WAKELINE_POM", raising=False)
    monkeypatch.delenv("WAKELINE_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    pom = paths.find_pom()
    assert pom.name == "pom.xml" and (pom.parent / "pyproject.toml").is_file()
    assert "<artifactId>kafka_2.13</artifactId>" in pom.read_text()
    assert paths.cache_dir() == pom.parent / ".cache"


def test_bogus_pom_override_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WAKELINE_POM", "/nonexistent/pom.xml")
    with pytest.raises(PrerequisiteMissing, match="WAKELINE_POM"):
        paths.find_pom()


# --- ports and addresses ------------------------------------------------------


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    assert not port_is_open(free_port())


def test_each_service_picks_its_own_ports() -> None:
    kafka = KafkaBroker(base_dir=Path("/nonexistent"))
    assert kafka.port != kafka.controller_port
    assert kafka.bootstrap == f"127.0.0.1:{kafka.port}"
    pg = PostgresServer(base_dir=Path("/nonexistent"))
    assert pg.dsn == f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
    assert TansuBroker(port=4567).bootstrap == "127.0.0.1:4567"


def test_dsn_with_database() -> None:
    assert dsn_with_database("postgresql://u@h:5/postgres", "x") == "postgresql://u@h:5/x"
    assert dsn_with_database("postgresql://u@h:5/postgres?sslmode=disable", "x") == (
        "postgresql://u@h:5/x?sslmode=disable")
    kv = dsn_with_database("host=h port=5 dbname=postgres", "x")
    assert "dbname=x" in kv and "host=h" in kv


def test_bad_database_names_are_rejected() -> None:
    from wakeline.errors import ConfigError

    pg = PostgresServer(base_dir=Path("/nonexistent"))
    with pytest.raises(ConfigError):
        pg.create_database('x"; DROP DATABASE postgres; --')


# --- configuration rendering --------------------------------------------------


def test_kafka_server_properties() -> None:
    broker = KafkaBroker(base_dir=Path("/tmp/k"), config={"num.partitions": "3"})
    props = broker.server_properties()
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{broker.controller_port}"
    assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{broker.port}"
    assert props["offsets.topic.num.partitions"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "true"
    assert props["num.partitions"] == "3"  # overrides win
    assert len(new_cluster_id()) == 22


def test_connect_worker_properties_keep_plugins_off_the_classpath(tmp_path: Path) -> None:
    connect = KafkaConnect("127.0.0.1:9092", base_dir=tmp_path)
    props = connect.worker_properties(tmp_path / "plugins")
    assert props["value.converter"] == "org.apache.kafka.connect.json.JsonConverter"
    assert props["value.converter.schemas.enable"] == "false"
    assert props["key.converter.schemas.enable"] == "false"
    assert props["plugin.path"] == str((tmp_path / "plugins").resolve())
    assert props["listeners"] == f"http://127.0.0.1:{connect.rest_port}"
    assert connect.rest_url == f"http://127.0.0.1:{connect.rest_port}"


def test_postgres_settings_are_logical() -> None:
    pg = PostgresServer(base_dir=Path("/nonexistent"), settings={"max_connections": "50"})
    assert pg.settings["wal_level"] == "logical"
    assert pg.settings["max_connections"] == "50"


# --- prerequisites ------------------------------------------------------------


def test_bogus_java_home_is_a_prerequisite_error(tmp_path: Path) -> None:
    with pytest.raises(PrerequisiteMissing) as info:
        maven.find_java(java_home=tmp_path)
    message = str(info.value)
    assert "Java 17 not found" in message and "--broker tansu" in message


def test_bogus_java_home_env_is_not_silently_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(PrerequisiteMissing, match="JAVA_HOME"):
        maven.find_java()


def test_empty_path_means_no_java_and_no_maven(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(PrerequisiteMissing, match="Java 17 not found on PATH"):
        maven.find_java(search_path="")
    with pytest.raises(PrerequisiteMissing, match=r"Maven \(mvn\) not found"):
        maven.find_mvn(search_path="")


def test_missing_tansu_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", "/nonexistent/tansu")
    with pytest.raises(PrerequisiteMissing, match="Tansu broker not found"):
        find_tansu()


def _fake_cache(cache: Path) -> None:
    libs = cache / "kafka" / "libs"
    libs.mkdir(parents=True)
    (libs / "kafka_2.13-4.1.1.jar").write_bytes(b"")
    (cache / "kafka" / "plugins").mkdir()
    (cache / "kafka" / ".complete").write_text(maven._fingerprint(paths.find_pom()))


def test_ensure_jars_skips_maven_when_cached(tmp_path: Path) -> None:
    _fake_cache(tmp_path)
    # An empty PATH: had it tried to run Maven, this would raise.
    dist = maven.ensure_jars(tmp_path, search_path="")
    assert dist.libs == tmp_path / "kafka" / "libs"
    assert dist.classpath.endswith("libs/*")


def test_ensure_jars_refetches_when_the_pom_changed(tmp_path: Path) -> None:
    _fake_cache(tmp_path)
    (tmp_path / "kafka" / ".complete").write_text("an older pom\n")
    assert not maven.jars_present(tmp_path)
    with pytest.raises(PrerequisiteMissing, match="Maven"):
        maven.ensure_jars(tmp_path, search_path=str(_dir_with_only_java(tmp_path)))


def _dir_with_only_java(tmp_path: Path) -> Path:
    folder = tmp_path / "bin-only-java"
    folder.mkdir()
    (folder / "java").symlink_to(os.path.realpath(maven.find_java()))
    return folder


# --- process control ----------------------------------------------------------


def _spawn(tmp_path: Path, script: str) -> ProcessHandle:
    return ProcessHandle.spawn(["sh", "-c", script], log_path=tmp_path / "p.log")


def test_stop_kills_a_process_that_ignores_sigterm_and_its_group(tmp_path: Path) -> None:
    proc = _spawn(tmp_path, "sleep 300 & trap '' TERM; echo started; while :; do sleep 0.1; done")
    deadline = time.monotonic() + 5
    while len(descendants(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    family = descendants(proc.pid)
    began = time.monotonic()
    proc.stop(timeout=0.5)
    assert time.monotonic() - began < 5
    assert not proc.alive()
    assert not [p for p, t in family if pid_alive(p, t)]
    assert "started" in (tmp_path / "p.log").read_text()


def test_stop_reaches_children_that_left_the_group(tmp_path: Path) -> None:
    # Like PostgreSQL backends, which call setsid().
    proc = _spawn(tmp_path, "setsid sleep 300 & wait")
    deadline = time.monotonic() + 5
    while not descendants(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    family = descendants(proc.pid)
    assert family
    proc.stop(timeout=2)
    assert not [p for p, t in family if pid_alive(p, t)]


def test_adopted_record_with_another_start_time_is_never_signalled(tmp_path: Path) -> None:
    proc = _spawn(tmp_path, "sleep 300")
    try:
        assert proc.ticks is not None
        stale = ProcessHandle.from_record({"pid": proc.pid, "start_ticks": proc.ticks + 1})
        assert not stale.alive()
        stale.stop()
        assert proc.alive()
        adopted = ProcessHandle.from_record(proc.to_record())
        assert adopted.alive()
    finally:
        proc.stop()
    assert not proc.alive()


def test_adopted_record_stops_the_process(tmp_path: Path) -> None:
    proc = _spawn(tmp_path, "sleep 300")
    adopted = ProcessHandle.from_record(proc.to_record())
    adopted.stop(sig=signal.SIGTERM, timeout=5)
    proc.popen.wait(5)  # type: ignore[union-attr]
    assert not proc.alive()


class _Fake(ProcessService):
    name: ClassVar[str] = "fake"

    def __init__(self, script: str, base_dir: Path) -> None:
        super().__init__(base_dir=base_dir)
        self.script = script

    def _prepare(self) -> list[str]:
        return ["sh", "-c", self.script]

    def is_ready(self) -> bool:
        return False


def test_a_service_that_dies_reports_its_log(tmp_path: Path) -> None:
    fake = _Fake("echo boom >&2; exit 3", tmp_path)
    with pytest.raises(ServiceError, match="exited before becoming ready") as info:
        fake.up(10)
    assert "boom" in str(info.value)


def test_a_service_that_never_gets_ready_times_out_and_is_stopped(tmp_path: Path) -> None:
    fake = _Fake("sleep 300", tmp_path)
    with pytest.raises(ServiceTimeout):
        fake.up(0.5)
    assert fake.process is not None and not fake.process.alive()


# --- CLI state and commands ---------------------------------------------------


def test_state_roundtrip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WAKELINE_HOME", str(tmp_path))
    assert state.load() == {}
    state.save({"postgres": {"dsn": "postgresql://x", "managed": False}})
    assert state.load()["postgres"]["dsn"] == "postgresql://x"
    assert state.is_alive(state.load()["postgres"]) is None
    state.save({})
    assert not state.state_file().exists()
    state.remember_port("postgres", 5999)
    assert state.last_ports() == {"postgres": 5999}


def test_port_if_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        assert state.port_if_free(busy) is None
    assert state.port_if_free(None) is None
    port = free_port()
    assert state.port_if_free(port) == port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    services_cmd.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_parses_every_subcommand() -> None:
    parser = _parser()
    up = parser.parse_args(["services", "up", "--broker", "kafka", "--timeout", "5"])
    assert (up.broker, up.timeout, up.pg_dsn, up.bootstrap) == ("kafka", 5.0, None, None)
    for cmd in ("up", "status", "down", "fetch"):
        assert callable(parser.parse_args(["services", cmd]).func)
    with pytest.raises(SystemExit):
        parser.parse_args(["services", "up", "--broker", "zookeeper"])


def test_cli_status_with_nothing_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WAKELINE_HOME", str(tmp_path))
    args = _parser().parse_args(["services", "status"])
    assert args.func(args) == 1
    assert "no services running" in capsys.readouterr().out
    args = _parser().parse_args(["services", "down"])
    assert args.func(args) == 0


def test_cli_status_reports_a_dead_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WAKELINE_HOME", str(tmp_path))
    proc = _spawn(tmp_path, "exit 0")
    proc.popen.wait(5)  # type: ignore[union-attr]
    state.save({"broker": {"managed": True, "kind": "tansu", "bootstrap": "127.0.0.1:1",
                           **proc.to_record()}})
    args = _parser().parse_args(["services", "status"])
    assert args.func(args) == 1
    assert "dead" in capsys.readouterr().out



def test_redact_dsn_hides_passwords() -> None:
    from wakeline.services.postgres import redact_dsn

    assert redact_dsn("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact_dsn("postgresql://u@h:5/db") == "postgresql://u@h:5/db"
    assert "secret" not in redact_dsn("host=h password=secret dbname=x")
    assert "a b" not in redact_dsn("host=h password='a b' dbname=x")


def test_unreachable_external_service_times_out_naming_it() -> None:
    from wakeline.services import ExternalPostgres

    pg = ExternalPostgres(f"postgresql://u:secret@127.0.0.1:{free_port()}/x")
    with pytest.raises(ServiceTimeout) as info:
        pg.up(0.3)
    assert "not ready" in str(info.value) and "127.0.0.1" in str(info.value)
    assert "secret" not in str(info.value)
