"""What a run reads: the driving-source rows of one entity, cut at the first unready.

Shared by the derive worker (rows from PostgreSQL) and the Simulator (rows in
memory) so both consume exactly the same records and advance the watermark to
the same seq.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from wakeline.core.plan import DerivationPlan, Rec


@dataclass(frozen=True)
class RunInput:
    seen: list[Rec]        # what the derivation function receives
    consumed: list[Rec]    # the pending ready records this run consumes
    watermark_after: int

    def is_empty(self) -> bool:
        return not self.seen


def select_input(d: DerivationPlan, rows: Iterable[Rec], watermark: int) -> RunInput:
    """``rows``: the entity's driving-source rows (any readiness), in any order.

    ``changes`` sees the consumed rows; ``snapshot`` every ready row below the cut;
    ``current`` and ``view`` the slot heads (tombstones omitted) and event rows.
    The watermark advances to the highest consumed seq and never passes an
    unready row (invariant 6).
    """
    ordered = sorted((r for r in rows if d.source.base_match(r)), key=lambda r: r.seq)
    first_unready = next((r.seq for r in ordered if r.seq > watermark and not r.ready), None)
    limit = first_unready if first_unready is not None else float("inf")
    consumed = [r for r in ordered if watermark < r.seq < limit and r.ready]
    after = max([watermark] + [r.seq for r in consumed])
    if d.mode == "changes":
        return RunInput(consumed, consumed, after)
    visible = [r for r in ordered if r.ready and r.seq < limit]
    if d.mode == "snapshot":
        return RunInput(visible, consumed, after)
    heads: dict[tuple[str, str], Rec] = {}
    events = []
    for r in visible:
        if r.key is not None:
            if r.status == "active":
                heads[(r.collection, r.key)] = r
        else:
            events.append(r)
    current = sorted([h for h in heads.values() if not h.tombstone] + events, key=lambda r: r.seq)
    return RunInput(current, consumed, after)


def record_dict(r: Rec) -> dict[str, Any]:
    """A record as the derivation contract hands it to a function."""
    return {"seq": r.seq, "collection": r.collection, "collection_version": r.version,
            "type": r.type, "status": r.status, "key": r.key, "content": dict(r.content),
            "text": r.text, "tombstone": r.tombstone, "parents": list(r.parents),
            "annotations": dict(r.annotations), "scores": dict(r.scores),
            "created_at": datetime.fromtimestamp(r.created_at, UTC)}


def definition_hashes(plan_hash: str, d: DerivationPlan, trigger_hashes: dict[str, str],
                      reasons: Iterable[str]) -> dict[str, str]:
    """The definition references a run records: catalog, derivation, each trigger."""
    out = {"catalog": plan_hash, f"derivation:{d.name}": d.hash}
    for reason in reasons:
        if reason.startswith("trigger:"):
            name = reason.split(":")[1]
            if name in trigger_hashes:
                out[f"trigger:{name}"] = trigger_hashes[name]
    return out
