"""Change data capture: PostgreSQL changes as a Debezium-style topic.

Two producers write the same envelopes to the change topic (one topic, keyed by
(workspace, entity), commit order per partition):

- real Debezium in Kafka Connect (:mod:`wakeline.cdc.debezium`: the connector
  configuration, shipped as ``connect/wakeline-postgres.json``);
- the built-in :class:`Relay` over pgoutput logical decoding (embedded default).

One parser reads both: :func:`parse` → :data:`ChangeEvent`.  Bad messages go to
the dead-letter topic (:class:`DeadLetterWriter`); :class:`ChangeConsumer` does
both while reading the topic.

    wakeline.cdc.envelope    parse(): typed events (the contract)
    wakeline.cdc.relay       Relay: slot → Kafka, at least once, never splits a commit
    wakeline.cdc.snapshot    op "r" events from the current rows (rebuild)
    wakeline.cdc.compose     how the relay writes an envelope
    wakeline.cdc.pgoutput    the pgoutput binary protocol decoder
    wakeline.cdc.values      PostgreSQL text → Debezium JSON values
    wakeline.cdc.dlq         dead-letter topic format
    wakeline.cdc.consumer    ChangeConsumer
    wakeline.cdc.debezium    connector config, DebeziumConnector
    wakeline.cdc.partitioner Kafka's murmur2 partitioner
    wakeline.cdc.errors      the error hierarchy
"""

from wakeline.cdc.consumer import ChangeConsumer, Consumed
from wakeline.cdc.dlq import DEFAULT_DLQ_TOPIC, DeadLetter, DeadLetterWriter
from wakeline.cdc.envelope import (
    ChangeEvent,
    CursorAdvance,
    CursorRow,
    RawChange,
    ReadyRecord,
    RecordDelete,
    RecordEvent,
    RecordUpdate,
    Source,
    TransactionMarker,
    UnreadyInsert,
    parse,
)
from wakeline.cdc.errors import CdcError, EnvelopeError, RelayError
from wakeline.cdc.relay import DEFAULT_TOPIC, Relay

__all__ = [
    "CdcError",
    "ChangeConsumer",
    "ChangeEvent",
    "Consumed",
    "CursorAdvance",
    "CursorRow",
    "DEFAULT_DLQ_TOPIC",
    "DEFAULT_TOPIC",
    "DeadLetter",
    "DeadLetterWriter",
    "EnvelopeError",
    "RawChange",
    "ReadyRecord",
    "RecordDelete",
    "RecordEvent",
    "RecordUpdate",
    "Relay",
    "RelayError",
    "Source",
    "TransactionMarker",
    "UnreadyInsert",
    "parse",
]
