"""Topologies: which services, topics and worker roles an environment runs.

A topology is one YAML file under ``topologies/``.  It is validated by pydantic
(unknown keys rejected) and errors name the file and the YAML path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from wakeline.errors import ConfigError


class TopologyInvalid(ConfigError):
    code = "topology.invalid"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokerSpec(_Model):
    kind: Literal["tansu", "kafka", "external"] = "tansu"
    bootstrap: str | None = None


class PostgresSpec(_Model):
    kind: Literal["embedded", "external"] = "embedded"
    dsn: str | None = None


class CdcSpec(_Model):
    kind: Literal["relay", "debezium"] = "relay"
    slot: str = "wakeline"
    publication: str = "wakeline"


class TopicSpec(_Model):
    name: str
    partitions: int = Field(default=4, ge=1, le=1024)


class Topics(_Model):
    changes: TopicSpec = TopicSpec(name="wakeline.changes")
    stimuli: TopicSpec = TopicSpec(name="wakeline.stimuli")
    derive: TopicSpec = TopicSpec(name="wakeline.derive")
    dead_letter: TopicSpec = TopicSpec(name="wakeline.dead-letter", partitions=1)
    #: the readiness stage's batches of decoded changes (wakeline.streams.ready), one
    #: partition per changes partition; default ``<changes name>.ready``
    ready_name: str | None = Field(default=None, alias="ready")

    @model_validator(mode="after")
    def _co_partitioned(self) -> Topics:
        # One agent consumes ready batches and stimuli together, keyed by entity.
        if self.changes.partitions != self.stimuli.partitions:
            raise ValueError("changes and stimuli must have the same partition count "
                             f"({self.changes.partitions} != {self.stimuli.partitions})")
        return self

    @property
    def ready(self) -> TopicSpec:
        """Co-partitioned with ``changes`` by construction: partition p of the ready
        topic holds the batches of partition p of the changes topic."""
        return TopicSpec(name=self.ready_name or f"{self.changes.name}.ready",
                         partitions=self.changes.partitions)

    def state_changelog(self, app_id: str) -> TopicSpec:
        """The conditions agents' per-entity state changelog (compacted), one partition
        per changes partition (wakeline.streams.statestore)."""
        return TopicSpec(name=f"{app_id}-wakeline-entity-state-changelog",
                         partitions=self.changes.partitions)


class Topology(_Model):
    name: str
    workspace: str = "default"
    catalog: str = "catalog"
    broker: BrokerSpec = BrokerSpec()
    postgres: PostgresSpec = PostgresSpec()
    cdc: CdcSpec = CdcSpec()
    topics: Topics = Topics()
    #: where the conditions agents keep entity states: in memory, reloaded from their
    #: compacted changelog topic on assignment (wakeline.streams.statestore)
    state_store: Literal["memory"] = "memory"
    roles: dict[str, list[str]] = Field(default_factory=dict)


def load_topology(path: str | Path) -> Topology:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TopologyInvalid(f"{path}: cannot read topology: {exc}", file=str(path)) from exc
    try:
        return Topology.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"{path}: {loc}: {err['msg']}")
        raise TopologyInvalid("\n".join(lines), file=str(path)) from exc
