"""Readiness / enrichment: make unready records ready by running the catalog's enrichers.

For a record inserted unready into a collection whose ``enrichers:`` cover every
scorer and every required annotator, the readiness agent computes them and marks
the record ready in ONE UPDATE (annotations, scores and ``enriched_at``).  That
update is a committed change like any other, so the record reaches the
conditions agent through the change topic — the readiness gate is PostgreSQL's,
never the agent's memory.  Collections whose enrichment is incomplete are left
to an external enricher.  A failing enricher is retried with backoff; after the
budget it is a recorded ``enrichment_failed`` outcome, and the core's
``unready_stalled`` outcome says the record blocks its watermark.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from wakeline.catalog import Catalog
from wakeline.catalog._functions import resolve_callable
from wakeline.core.inputs import record_dict
from wakeline.core.outcomes import Outcome, OutcomeKind
from wakeline.core.plan import Rec
from wakeline.store import Store


class Enricher:
    def __init__(self, catalog: Catalog, store: Store, *, attempts: int = 3,
                 backoff: float = 0.5) -> None:
        self.store = store
        self.attempts = attempts
        self.backoff = backoff
        self.plans: dict[str, list[tuple[str, str, Callable[..., Any]]]] = {}
        for name, coll in catalog.collections.items():
            needed = set(coll.scorers) | {a for a, d in coll.annotators.items() if d.required}
            if not coll.enrichers or not needed <= set(coll.enrichers):
                continue
            steps = []
            for what, ref in sorted(coll.enrichers.items()):
                kind = "scorer" if what in coll.scorers else "annotator"
                steps.append((what, kind, resolve_callable(catalog.root, ref)))
            self.plans[name] = steps

    def handles(self, collection: str) -> bool:
        return collection in self.plans

    def enrich(self, workspace: str, entity: str, rec: Rec) -> Outcome | None:
        """Compute and mark ready; an Outcome when it could not (after retries)."""
        row = record_dict(rec)
        error: Exception | None = None
        for attempt in range(1, self.attempts + 1):
            scores: dict[str, Any] = {}
            annotations: dict[str, Any] = {}
            try:
                for what, kind, fn in self.plans[rec.collection]:
                    value = fn(row)
                    (scores if kind == "scorer" else annotations)[what] = value
            except Exception as exc:  # an enricher's failure is a recorded outcome
                error = exc
                time.sleep(self.backoff * 2 ** (attempt - 1))
                continue
            self.store.mark_ready([rec.seq], scores={rec.seq: scores},
                                  annotations={rec.seq: annotations})
            return None
        return Outcome(OutcomeKind.ENRICHMENT_FAILED,
                       f"enrichment of seq {rec.seq} failed after {self.attempts} attempts: "
                       f"{type(error).__name__}: {error}", datetime.now(UTC), workspace, entity,
                       None, None, {"seq": rec.seq, "collection": rec.collection})
