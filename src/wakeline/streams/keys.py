"""Message keys: compact JSON of (workspace, entity), byte-identical to Debezium's.

Kafka's JsonConverter writes the key columns as compact JSON in column order;
every producer here writes the same bytes, so the Java-compatible murmur2
partitioner puts all of an entity's messages on one partition (invariant 3).
"""

from __future__ import annotations

import json


def entity_key(workspace: str, entity: str) -> bytes:
    return json.dumps({"workspace": workspace, "entity": entity}, separators=(",", ":"),
                      ensure_ascii=False).encode()


def parse_key(raw: bytes | str | None) -> tuple[str, str] | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return str(data["workspace"]), str(data["entity"])
    except (ValueError, KeyError, TypeError):
        return None


_SEP = "\x1f"


def state_key(workspace: str, entity: str) -> str:
    """The entity store's key (and its changelog's).  Not JSON: it names the entity
    in a form no JSON reader turns into a dict."""
    return f"{workspace}{_SEP}{entity}"


def split_state_key(key: str) -> tuple[str, str]:
    workspace, _, entity = key.partition(_SEP)
    return workspace, entity
