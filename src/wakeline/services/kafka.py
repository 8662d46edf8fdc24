"""Apache Kafka 4.1 in KRaft mode: one node that is both broker and controller.

The jars come from Maven Central (:func:`~wakeline.services.maven.ensure_jars`).
Storage is formatted once with a static quorum (``controller.quorum.voters``;
from 4.1 that must not be combined with ``StorageTool --standalone``), then
``kafka.Kafka`` runs in the foreground of its own process group.

Also here: :func:`probe` (the Kafka-protocol readiness check shared with Tansu)
and :class:`ExternalKafka`.
"""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from wakeline.errors import ServiceError
from wakeline.services.base import ExternalService, ProcessService, log_tail
from wakeline.services.maven import ensure_jars, find_java
from wakeline.services.ports import LOOPBACK, free_ports

#: JVM options for the broker and Connect. SerialGC: two cores and a small heap,
#: where G1's concurrent threads only compete with the tests.
JVM_OPTS: tuple[str, ...] = (
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)


def probe(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when a Kafka metadata request to ``bootstrap`` lists at least one broker."""
    # log_level 0: librdkafka would otherwise print every refused connection.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0,
                         "socket.connection.setup.timeout.ms": int(max(timeout, 1) * 1000)})
    try:
        return bool(admin.list_topics(timeout=timeout).brokers)
    except KafkaException:
        return False


def log4j_config(folder: Path) -> Path:
    """Write the packaged log4j2 configuration into ``folder`` and return its path."""
    target = folder / "log4j2.properties"
    text = resources.files("wakeline.services").joinpath("resources/log4j2.properties")
    target.write_text(text.read_text())
    return target


def write_properties(path: Path, values: Mapping[str, str]) -> Path:
    """Write a Java ``.properties`` file (values are plain: no escapes needed here)."""
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def java_command(java: str, classpath: str, log4j: Path, heap: str,
                 main: str, *args: str) -> list[str]:
    """The command line of a JVM service main class."""
    return [java, f"-Xmx{heap}", *JVM_OPTS, f"-Dlog4j2.configurationFile={log4j}",
            "-cp", classpath, main, *args]


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaBroker(ProcessService):
    """A single-node Apache Kafka KRaft cluster on loopback.

    :param port: client (PLAINTEXT) port; free when None.
    :param controller_port: KRaft controller port; free when None.
    :param java_home: JDK folder; default ``$JAVA_HOME`` or ``java`` on PATH.
    :param config: extra ``server.properties`` entries, overriding the defaults.
    :param cache: jar cache folder (default :func:`~wakeline.services.paths.cache_dir`).

    Attributes: ``port``, ``controller_port``, ``bootstrap`` (``"127.0.0.1:PORT"``),
    ``data_dir``.
    """

    name: ClassVar[str] = "kafka"

    def __init__(
        self,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        base_dir: Path | None = None,
        log_path: Path | None = None,
        java_home: str | None = None,
        heap: str = "512m",
        config: Mapping[str, str] | None = None,
        cache: Path | None = None,
        ephemeral: bool = False,
        search_path: str | None = None,
    ) -> None:
        super().__init__(base_dir=base_dir, log_path=log_path, ephemeral=ephemeral)
        ports = free_ports(2)
        self.port = port or ports[0]
        self.controller_port = controller_port or (ports[1] if ports[1] != self.port else ports[0])
        self.java_home = java_home
        self.heap = heap
        self.extra_config = dict(config or {})
        self.cache = cache
        self.search_path = search_path
        self.data_dir = self.base_dir / "data"

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        return f"{LOOPBACK}:{self.port}"

    def server_properties(self) -> dict[str, str]:
        """The broker configuration (defaults for a fast single-node test cluster)."""
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{LOOPBACK}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},"
                         f"CONTROLLER://{LOOPBACK}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "true",
            # One replica everywhere; 50 offsets partitions makes the first group slow.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            **self.extra_config,
        }

    def _format(self, java: str, classpath: str, log4j: Path, props: Path) -> None:
        # A formatted folder keeps its cluster id: formatting it again with a new id
        # fails even with --ignore-formatted, and skipping saves a JVM start.
        if (self.data_dir / "meta.properties").exists():
            return
        argv = java_command(java, classpath, log4j, "256m", "kafka.tools.StorageTool",
                            "format", f"--cluster-id={new_cluster_id()}", "-c", str(props),
                            "--ignore-formatted")
        with open(self.log_path, "ab") as log:
            done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT,
                                  cwd=self.base_dir, timeout=120)
        if done.returncode != 0:
            raise ServiceError(
                f"kafka storage format failed ({done.returncode}); log {self.log_path}:\n"
                + log_tail(self.log_path),
                log=str(self.log_path),
            )

    def _prepare(self) -> list[str]:
        java = find_java(self.java_home, self.search_path)  # first: the clearest error
        dist = ensure_jars(self.cache, java_home=self.java_home, search_path=self.search_path)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log4j = log4j_config(self.base_dir)
        props = write_properties(self.base_dir / "server.properties", self.server_properties())
        self._format(java, dist.classpath, log4j, props)
        return java_command(java, dist.classpath, log4j, self.heap, "kafka.Kafka", str(props))

    def is_ready(self) -> bool:
        """A metadata request succeeds."""
        return self.is_alive() and probe(self.bootstrap, timeout=1.0)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "kind": "kafka", "bootstrap": self.bootstrap,
                "port": self.port, "controller_port": self.controller_port}


class ExternalKafka(ExternalService):
    """A Kafka-protocol cluster someone else runs, reached through ``bootstrap``."""

    name: ClassVar[str] = "kafka"

    def __init__(self, bootstrap: str | Sequence[str]) -> None:
        self.bootstrap = bootstrap if isinstance(bootstrap, str) else ",".join(bootstrap)

    @property
    def address(self) -> str:
        return self.bootstrap

    def is_ready(self) -> bool:
        """A metadata request succeeds."""
        return probe(self.bootstrap)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "kind": "external", "bootstrap": self.bootstrap}
