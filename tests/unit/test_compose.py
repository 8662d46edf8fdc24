"""docker-compose.yml agrees with topologies/compose.yaml and the shipped connector.

There is no Docker engine here, so the file is checked statically: it parses, and
its services, ports, database, topic names and connector configuration agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import yaml

from wakeline.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_parses_and_has_every_service() -> None:
    services = compose()["services"]
    topo = load_topology(ROOT / "topologies" / "compose.yaml")
    expected = {"postgres", "kafka", "connect", "connect-init", "migrate", *topo.roles}
    assert expected <= set(services)
    for role in topo.roles:
        cmd = " ".join(services[role]["command"])
        assert f"--topology topologies/compose.yaml --role {role}" in cmd


def test_addresses_agree_with_the_topology() -> None:
    services = compose()["services"]
    topo = load_topology(ROOT / "topologies" / "compose.yaml")
    host, port = topo.broker.bootstrap.split(":")
    assert host in services and f"{port}:{port}" in services[host]["ports"]
    assert services[host]["environment"]["KAFKA_ADVERTISED_LISTENERS"].endswith(
        f"//{host}:{port}")
    dsn = urlparse(topo.postgres.dsn)
    pg = services[dsn.hostname]
    env = pg["environment"]
    assert (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]) == (
        dsn.username, dsn.password, dsn.path.lstrip("/"))
    assert "wal_level=logical" in pg["command"]
    assert f"{dsn.port}:{dsn.port}" in pg["ports"]


def test_connector_configuration_agrees() -> None:
    services = compose()["services"]
    topo = load_topology(ROOT / "topologies" / "compose.yaml")
    cfg = json.loads((ROOT / "connect" / "wakeline-postgres.json").read_text())["config"]
    dsn = urlparse(topo.postgres.dsn)
    assert cfg["database.hostname"] == dsn.hostname and cfg["database.port"] == str(dsn.port)
    assert cfg["database.dbname"] == dsn.path.lstrip("/")
    assert cfg["database.user"] == dsn.username
    assert cfg["transforms.route.replacement"] == topo.topics.changes.name
    assert cfg["topic.creation.default.partitions"] == str(topo.topics.changes.partitions)
    assert cfg["slot.name"] == topo.cdc.slot and cfg["publication.name"] == topo.cdc.publication
    assert cfg["plugin.name"] == "pgoutput"
    assert cfg["value.converter.replace.null.with.default"] == "false"
    connect_env = services["connect"]["environment"]
    assert connect_env["BOOTSTRAP_SERVERS"] == topo.broker.bootstrap
    assert "/connect:ro" in " ".join(services["connect-init"]["volumes"])
