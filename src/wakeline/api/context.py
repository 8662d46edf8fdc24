"""What the API needs at run time: database, broker, catalog, clock and settings.

One :class:`ApiContext` per app.  It owns a connection pool, one Kafka producer
for stimuli, and (lazily) the state view and the broker admin client; ``close``
releases them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from wakeline.api.config import ApiSettings
from wakeline.api.db import Pool
from wakeline.api.state_view import StateView
from wakeline.catalog import Catalog
from wakeline.clock import Clock, SystemClock
from wakeline.core.build import build_plan
from wakeline.topology import Topology


@dataclass
class ApiContext:
    topology: Topology
    catalog: Catalog
    dsn: str
    bootstrap: str
    settings: ApiSettings = field(default_factory=ApiSettings)
    clock: Clock = field(default_factory=SystemClock)
    app_id: str | None = None
    pool_size: int = 8

    def __post_init__(self) -> None:
        self.app_id = self.app_id or f"wakeline-{self.topology.name}"
        self.plan = build_plan(self.catalog)
        self.pool = Pool(self.dsn, size=self.pool_size)
        self._producer: Producer | None = None
        self._view: StateView | None = None
        self._lock = threading.Lock()
        self.catalog_dict: dict[str, Any] = self.catalog.to_dict()
        self.started_at = self.clock.now()

    @property
    def producer(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer({"bootstrap.servers": self.bootstrap,
                                           "partitioner": "murmur2_random",
                                           "enable.idempotence": True, "acks": "all",
                                           "linger.ms": 1, "message.timeout.ms": 10000,
                                           "log_level": 3})
            return self._producer

    @property
    def view(self) -> StateView:
        with self._lock:
            if self._view is None:
                assert self.app_id is not None
                self._view = StateView(self.bootstrap, self.app_id).start()
            return self._view

    def close(self) -> None:
        if self._view is not None:
            self._view.close()
        kafka = getattr(self, "_kafka", None)  # wakeline.api.ops.Kafka, made on first use
        if kafka is not None:
            kafka.consumer.close()
        if self._producer is not None:
            self._producer.flush(5)
        self.pool.close()
