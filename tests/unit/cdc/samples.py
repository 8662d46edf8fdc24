"""Real Debezium 3.4.3 output (JsonConverter, schemas disabled, this project's config).

Captured from Kafka Connect standalone + the Debezium PostgreSQL connector on
PostgreSQL 18 (see the capture notes in ``data/README.md``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "debezium-3.4.3.jsonl"


def messages() -> list[dict[str, Any]]:
    """Each: partition, offset, key (str), value (str)."""
    return [json.loads(line) for line in DATA.read_text().splitlines() if line]


def find(op: str, table: str, pred: Any = None) -> dict[str, Any]:
    for m in messages():
        v = json.loads(m["value"])
        if v["op"] == op and v["source"]["table"] == table and (pred is None or pred(v)):
            return m
    raise LookupError((op, table))
