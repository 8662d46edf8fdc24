"""Errors of the CDC package.

    WakelineError
    └── CdcError                         (code "cdc")
        ├── EnvelopeError                a change message that cannot be used
        │   ├── NotJson                  bytes that are not UTF-8 JSON (garbage, truncated)
        │   ├── NotAnEnvelope            JSON, but not a Debezium change envelope
        │   ├── MissingField             a required envelope / row field is absent
        │   ├── UnknownTable             a table the engine does not consume
        │   ├── UnknownOp                an ``op`` other than c/u/d/r
        │   ├── BadValue                 a column value of the wrong shape
        │   └── Oversized                more bytes than the configured limit
        ├── PgOutputError                a pgoutput message that does not decode
        ├── RelayError                   the relay cannot go on (slot, publication, broker)
        └── ConnectorError               Kafka Connect / Debezium did not come up

An :class:`EnvelopeError` is what the dead-letter path records: its ``code`` is
the machine reason and its message the human one.  Context is keyword-only
(``topic``, ``partition``, ``offset``, ``table``, ``op``, ``field``).
"""

from __future__ import annotations

from wakeline.errors import WakelineError


class CdcError(WakelineError):
    code = "cdc"


class EnvelopeError(CdcError):
    code = "cdc.envelope"


class NotJson(EnvelopeError):
    code = "cdc.envelope.not_json"


class NotAnEnvelope(EnvelopeError):
    code = "cdc.envelope.not_an_envelope"


class MissingField(EnvelopeError):
    code = "cdc.envelope.missing_field"


class UnknownTable(EnvelopeError):
    code = "cdc.envelope.unknown_table"


class UnknownOp(EnvelopeError):
    code = "cdc.envelope.unknown_op"


class BadValue(EnvelopeError):
    code = "cdc.envelope.bad_value"


class Oversized(EnvelopeError):
    code = "cdc.envelope.oversized"


class PgOutputError(CdcError):
    code = "cdc.pgoutput"


class RelayError(CdcError):
    code = "cdc.relay"


class ConnectorError(CdcError):
    code = "cdc.connector"
