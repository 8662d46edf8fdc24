"""Real Debezium: the connector configuration the project ships, and running it.

:func:`connector_config` is the one definition of the Debezium PostgreSQL
connector settings; ``connect/wakeline-postgres.json`` at the repo root is
:func:`shipped_config` written out (a unit test keeps them equal), for the
compose topology's Connect container (``POST /connectors``).

Why each setting (the relay writes the same envelopes, see ``compose.py``):

- ``plugin.name=pgoutput``, ``publication.name=wakeline`` with
  ``publication.autocreate.mode=disabled``: the publication migration 0002
  creates (records + derivation_cursors), shared with the relay.
- ``message.key.columns``: key = (workspace, entity) for both tables, so every
  event of an entity is on one partition in commit order.
- ``transforms.route`` (RegexRouter): both tables into ONE topic, keys untouched.
- ``tombstones.on.delete=false``: no null-valued Kafka tombstones after deletes.
- ``value.converter.replace.null.with.default=false``: explicit NULLs stay NULL
  (``enriched_at`` must stay null until the record is ready).
- ``decimal.handling.mode=string``; timestamptz arrive as ZonedTimestamp ISO
  strings and jsonb as JSON strings under any ``time.precision.mode``.
- ``heartbeat.interval.ms``: the slot advances while only other tables change.
- ``poll.interval.ms=50`` (default 500): Debezium hands a batch to Connect when it
  is full (2048) or this much time passed, so at a few hundred commits/s the
  default adds ~0.5 s per event; 50 ms took the p50 commit → topic latency at
  1k commits/s from ~1.2 s to ~0.13 s (``bench/cdc_latency.py``).
- ``message.prefix.exclude.list``: ignore the relay's heartbeat messages.

:class:`DebeziumConnector` creates a connector on a running
:class:`~wakeline.services.KafkaConnect` and waits until it really streams:
connector and task RUNNING, the slot active, and a sentinel row seen on the
topic.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import psycopg
from confluent_kafka import Consumer, TopicPartition

from wakeline.cdc.compose import KEY_COLUMNS
from wakeline.cdc.errors import ConnectorError
from wakeline.cdc.partitioner import partition_for
from wakeline.cdc.relay import DEFAULT_PUBLICATION, DEFAULT_TOPIC, HEARTBEAT_PREFIX
from wakeline.errors import ServiceError
from wakeline.services import KafkaConnect

DEFAULT_CONNECTOR: Final = "wakeline-postgres"
DEFAULT_SLOT: Final = "wakeline_debezium"
SENTINEL_WORKSPACE: Final = "__wakeline_sentinel__"
JSON_CONVERTER: Final = "org.apache.kafka.connect.json.JsonConverter"

#: Where the shipped file lives, relative to the repo root.
SHIPPED_PATH: Final = Path("connect") / "wakeline-postgres.json"


def _regex_escape_dots(text: str) -> str:
    return text.replace(".", "\\.")


def connector_config(
    *,
    hostname: str,
    port: int | str,
    user: str,
    password: str,
    dbname: str,
    topic: str = DEFAULT_TOPIC,
    server_name: str = "wakeline",
    slot: str = DEFAULT_SLOT,
    publication: str = DEFAULT_PUBLICATION,
    partitions: int = 4,
    snapshot_mode: str = "initial",
    schema: str = "public",
    heartbeat_ms: int = 10000,
    poll_ms: int = 50,
) -> dict[str, str]:
    """The Debezium PostgreSQL connector configuration (all values strings)."""
    tables = list(KEY_COLUMNS)
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": hostname,
        "database.port": str(port),
        "database.user": user,
        "database.password": password,
        "database.dbname": dbname,
        "topic.prefix": server_name,
        "table.include.list": ",".join(f"{schema}.{t}" for t in tables),
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "slot.name": slot,
        "snapshot.mode": snapshot_mode,
        "message.key.columns": ";".join(
            f"{schema}.{t}:{','.join(KEY_COLUMNS[t])}" for t in tables),
        "decimal.handling.mode": "string",
        "time.precision.mode": "adaptive",
        "binary.handling.mode": "bytes",
        "tombstones.on.delete": "false",
        "provide.transaction.metadata": "false",
        "heartbeat.interval.ms": str(heartbeat_ms),
        "poll.interval.ms": str(poll_ms),
        "message.prefix.exclude.list": _regex_escape_dots(HEARTBEAT_PREFIX) + ".*",
        "key.converter": JSON_CONVERTER,
        "key.converter.schemas.enable": "false",
        "value.converter": JSON_CONVERTER,
        "value.converter.schemas.enable": "false",
        "value.converter.replace.null.with.default": "false",
        "transforms": "route",
        "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
        "transforms.route.regex": f".*\\.{_regex_escape_dots(schema)}\\.({'|'.join(tables)})",
        "transforms.route.replacement": topic,
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": str(partitions),
    }


def config_from_dsn(dsn: str, **kwargs: Any) -> dict[str, str]:
    """:func:`connector_config` with the database fields taken from a libpq DSN."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return connector_config(
        hostname=str(info.get("host") or "127.0.0.1"),
        port=str(info.get("port") or 5432),
        user=str(info.get("user") or "postgres"),
        password=str(info.get("password") or ""),
        dbname=str(info.get("dbname") or "postgres"),
        **kwargs,
    )


def shipped_config() -> dict[str, Any]:
    """The REST body of ``connect/wakeline-postgres.json`` (the compose topology)."""
    return {
        "name": DEFAULT_CONNECTOR,
        "config": connector_config(hostname="postgres", port=5432, user="wakeline",
                                   password="wakeline", dbname="wakeline", partitions=8),
    }


def shipped_json() -> str:
    """The exact text of the shipped file."""
    return json.dumps(shipped_config(), indent=2) + "\n"


class DebeziumConnector:
    """One Debezium connector on a Kafka Connect worker.

    :param connect: the worker (a started :class:`KafkaConnect`).
    :param config: from :func:`connector_config` / :func:`config_from_dsn`.
    :param name: the connector name.
    """

    def __init__(self, connect: KafkaConnect, config: Mapping[str, str], *,
                 name: str = DEFAULT_CONNECTOR) -> None:
        self.connect = connect
        self.config = dict(config)
        self.name = name

    @property
    def slot(self) -> str:
        return self.config["slot.name"]

    @property
    def topic(self) -> str:
        return self.config["transforms.route.replacement"]

    def create(self) -> None:
        """Create or update the connector (``PUT /connectors/<name>/config``, idempotent)."""
        self.connect.request("PUT", f"/connectors/{self.name}/config", self.config)

    def status(self) -> dict[str, Any]:
        try:
            st: dict[str, Any] = self.connect.request("GET", f"/connectors/{self.name}/status")
        except ServiceError as exc:
            return {"connector": {"state": "MISSING", "trace": str(exc)}, "tasks": []}
        return st

    def delete(self) -> None:
        """Remove the connector (its slot stays: :func:`drop_slot`)."""
        try:
            self.connect.request("DELETE", f"/connectors/{self.name}")
        except ServiceError as exc:
            if getattr(exc, "context", {}).get("status") != 404:
                raise

    def wait_running(self, timeout: float = 60.0) -> None:
        """Until the connector and its task are RUNNING.

        :raises ConnectorError: FAILED (with Debezium's trace) or timeout.
        """
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            st = self.status()
            tasks = st.get("tasks") or []
            states = [st.get("connector", {}).get("state")] + [t.get("state") for t in tasks]
            failed = [t for t in tasks if t.get("state") == "FAILED"]
            if st.get("connector", {}).get("state") == "FAILED":
                failed.append(st["connector"])
            if failed:
                trace = (failed[0].get("trace") or "")[:3000]
                raise ConnectorError(f"Debezium connector {self.name} FAILED:\n{trace}",
                                     connector=self.name)
            if tasks and all(s == "RUNNING" for s in states):
                return
            if time.monotonic() >= deadline:
                raise ConnectorError(f"Debezium connector {self.name} not RUNNING after "
                                     f"{timeout:g}s: {states}", connector=self.name)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def wait_slot_active(self, dsn: str, timeout: float = 60.0) -> None:
        """Until the replication slot exists and a walsender streams from it."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                                   (self.slot,)).fetchone()
                if row is not None and row[0]:
                    return
                if time.monotonic() >= deadline:
                    raise ConnectorError(f"slot {self.slot} not active after {timeout:g}s "
                                         f"(connector {self.name})", slot=self.slot)
                time.sleep(0.1)

    def wait_streaming(self, dsn: str, bootstrap: str, *, timeout: float = 60.0,
                       partitions: int | None = None) -> float:
        """RUNNING, slot active, and a sentinel row seen on the topic; return seconds.

        The sentinel is a record in workspace ``__wakeline_sentinel__``, deleted
        again once seen (both changes reach the topic under that workspace).
        """
        began = time.monotonic()
        self.wait_running(timeout)
        self.wait_slot_active(dsn, max(1.0, timeout - (time.monotonic() - began)))
        wait_for_sentinel(dsn, bootstrap, self.topic,
                          timeout=max(1.0, timeout - (time.monotonic() - began)),
                          partitions=partitions)
        return time.monotonic() - began


def drop_slot(dsn: str, slot: str, timeout: float = 30.0) -> None:
    """Drop a replication slot once no walsender holds it."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT active, active_pid FROM pg_replication_slots "
                               "WHERE slot_name = %s", (slot,)).fetchone()
            if row is None:
                return
            if not row[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                return
            if time.monotonic() >= deadline:
                conn.execute("SELECT pg_terminate_backend(%s)", (row[1],))
                deadline = time.monotonic() + 5
            time.sleep(0.1)


def wait_for_sentinel(dsn: str, bootstrap: str, topic: str, *, timeout: float = 60.0,
                      partitions: int | None = None) -> None:
    """Insert a sentinel record and wait until its change is on ``topic``.

    Reads only the sentinel key's partition, from its end offset before the
    insert, so the wait costs one round trip however long the topic is.
    """
    entity = f"sentinel:{secrets.token_hex(6)}"
    key = json.dumps({"workspace": SENTINEL_WORKSPACE, "entity": entity},
                     separators=(",", ":")).encode()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "wakeline-sentinel",
                         "enable.auto.commit": False, "log_level": 3})
    deadline = time.monotonic() + timeout
    try:
        while True:
            meta = consumer.list_topics(topic, timeout=5)
            t = meta.topics.get(topic)
            if t is not None and t.error is None and t.partitions:
                break
            if time.monotonic() >= deadline:
                raise ConnectorError(f"topic {topic} does not exist", topic=topic)
            time.sleep(0.1)
        count = partitions or len(t.partitions)
        part = partition_for(key, count)
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
        consumer.assign([TopicPartition(topic, part, high)])
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "INSERT INTO records (workspace, entity, collection) VALUES (%s, %s, "
                "'__sentinel__') RETURNING seq", (SENTINEL_WORKSPACE, entity)).fetchone()
            assert row is not None
            try:
                while time.monotonic() < deadline:
                    msg = consumer.poll(0.2)
                    if msg is not None and msg.error() is None and msg.key() == key:
                        return
                raise ConnectorError(
                    f"sentinel row {entity} not seen on {topic}[{part}] after {timeout:g}s: "
                    "the connector runs but does not stream", topic=topic)
            finally:
                conn.execute("DELETE FROM records WHERE seq = %s", (row[0],))
    finally:
        consumer.close()
