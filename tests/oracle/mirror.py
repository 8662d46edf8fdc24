"""Copy a :class:`wakeline.testing.Simulator`'s state into PostgreSQL.

Every record keeps its seq (``OVERRIDING SYSTEM VALUE``); instants (float epoch
seconds in the simulator) become ``timestamptz``.  One ``derivation_cursors`` row is
written per (derivation, entity) from ``sim.cursor(...)`` (watermark, last run, last
success, at_handled_through).  The tables are emptied first, so each call reloads
the whole state (the histories are small).

Rows travel as one JSON document per table (``jsonb_array_elements``): a single
parameter is much cheaper to send than sixteen typed arrays.

The caller owns the transaction: ``mirror`` only issues statements.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg import Connection

from wakeline.clock import parse_instant

__all__ = ["mirror", "record_rows"]

_RECORDS = """
INSERT INTO records (seq, workspace, entity, collection, collection_version, type, status,
                     key, content, text, tombstone, parents, annotations, scores,
                     enriched_at, created_at)
OVERRIDING SYSTEM VALUE
SELECT (x ->> 'seq')::bigint, %(ws)s, x ->> 'entity', x ->> 'collection',
       (x ->> 'version')::int, x ->> 'type', x ->> 'status', x ->> 'key', x -> 'content',
       x ->> 'text', (x ->> 'tombstone')::boolean,
       ARRAY(SELECT jsonb_array_elements_text(x -> 'parents'))::bigint[],
       x -> 'annotations', x -> 'scores',
       to_timestamp((x ->> 'enriched_at')::float8), to_timestamp((x ->> 'created_at')::float8)
FROM jsonb_array_elements(%(rows)s::jsonb) AS x
"""

_CURSORS = """
INSERT INTO derivation_cursors (workspace, derivation, entity, watermark, last_run_at,
                                last_success_at, at_handled_through)
SELECT %(ws)s, x ->> 0, x ->> 1, (x ->> 2)::bigint, (x ->> 3)::timestamptz,
       (x ->> 4)::timestamptz, (x ->> 5)::timestamptz
FROM jsonb_array_elements(%(rows)s::jsonb) AS x
"""


def record_rows(sim: Any) -> list[dict[str, Any]]:
    """The simulator's records as JSON-able ``records`` rows (in seq order)."""
    rows = []
    for seq in sorted(sim.records):
        r = sim.records[seq]
        rows.append({
            "seq": r.seq, "entity": sim._entity_of[seq], "collection": r.collection,
            "version": r.version, "type": r.type, "status": r.status, "key": r.key,
            "content": r.content, "text": r.text, "tombstone": r.tombstone,
            "parents": list(r.parents), "annotations": r.annotations, "scores": r.scores,
            "enriched_at": r.enriched_at, "created_at": r.created_at,
        })
    return rows


def _iso(value: str | None) -> str | None:
    return None if value is None else parse_instant(value).isoformat()


def mirror(conn: Connection[Any], sim: Any) -> None:
    """Replace ``records`` and ``derivation_cursors`` with the simulator's state."""
    conn.execute("DELETE FROM records")
    conn.execute("DELETE FROM derivation_cursors")
    rows = record_rows(sim)
    if rows:
        conn.execute(_RECORDS, {"ws": sim.workspace,
                                "rows": json.dumps(rows, allow_nan=False)})
    entities = sorted(set(sim._entity_of.values()))
    cursors = []
    for d in sorted(sim.catalog.derivations):
        for e in entities:
            c = sim.cursor(d, e)
            cursors.append((d, e, c["watermark"], _iso(c["last_run_at"]),
                            _iso(c["last_success_at"]), _iso(c["at_handled_through"])))
    if cursors:
        conn.execute(_CURSORS, {"ws": sim.workspace, "rows": json.dumps(cursors)})
