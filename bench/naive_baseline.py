"""Naive baseline: what a user would write instead of Wakeline — poll PostgreSQL on a
timer, one SQL query per trigger per entity — against the condition core, on the
same workload, checked to give the same answers.

Workload: the mixed catalog (write+where, accumulator, census, changed) and the
record stream of ``core_throughput.py``, inserted into a real PostgreSQL (embedded)
in ``--polls`` slices.  After each slice:

- naive: for every entity seen so far and every trigger, one prepared SQL statement
  (the reference evaluator in ``tests/oracle/sql.py``, which answers each condition
  from the ``records`` and ``derivation_cursors`` rows alone) says whether it holds;
  each trigger that holds is a run, recorded by advancing its cursor row;
- core: the slice's records go through ``Engine.apply`` as they arrive; the jobs it
  dispatched are the runs, completed at the slice's end with the same watermark.

The two run sets must be equal at every slice (the script exits non-zero and
prints the differences otherwise).  Figures: records/s each evaluator sustains
(evaluation time only; the inserts are the same for both and not counted), and
last the ratio core/naive (the issue-6 target is Wakeline ≥ 10× the naive one).

    python bench/naive_baseline.py [--entities 2000] [--records 20000] [--polls 10] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _catalog import write as write_catalog  # noqa: E402
from core_throughput import workload  # noqa: E402

from wakeline.catalog import compile_catalog  # noqa: E402
from wakeline.core.build import build_plan  # noqa: E402
from wakeline.core.engine import Engine  # noqa: E402
from wakeline.core.events import CursorAdvanced, RecordChanged  # noqa: E402
from wakeline.core.plan import Rec  # noqa: E402
from wakeline.core.state import EntityState  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entities", type=int, default=2_000)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--polls", type=int, default=10)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        a.entities, a.records, a.polls = 40, 400, 3

    import psycopg

    from tests.oracle.sql import Oracle, install
    from wakeline.services import PostgresServer
    from wakeline.store import Store, migrate
    from wakeline.store.records import NewRecord

    stream = [(e, json.loads(raw)) for e, raw in workload(a.entities, a.records)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the embedded server may run as another user
        catalog = compile_catalog(write_catalog(root / "catalog"))
        plan = build_plan(catalog)
        engine = Engine(plan)
        sources = {n: sorted({c for c, _ in d.source.collections})
                   for n, d in plan.derivations.items()}
        by_derivation = {t: catalog.triggers[t].derivation for t in catalog.triggers}
        versions = {n: c.active_version for n, c in catalog.collections.items()}
        pg = PostgresServer(base_dir=root / "pg", ephemeral=True)
        pg.up(120)
        try:
            dsn = pg.create_database("naive")
            migrate(dsn)
            store = Store.connect(dsn)
            conn = psycopg.connect(dsn, autocommit=True)
            install(conn)
            oracles = {t: Oracle(catalog, "default", [t]) for t in sorted(catalog.triggers)}
            states: dict[str, EntityState] = {}
            top: dict[tuple[str, str], int] = {}  # (entity, collection) -> max seq
            naive_s = core_s = 0.0
            naive_runs = core_runs = queries = 0
            mismatches: list[str] = []
            now_dt = datetime.now(UTC)
            now = now_dt.timestamp()
            size = -(-len(stream) // a.polls)
            for p in range(a.polls):
                part = stream[p * size:(p + 1) * size]
                if not part:
                    break
                seqs = store.insert_records(NewRecord(
                    workspace="default", entity=e, collection=r["collection"],
                    collection_version=versions[r["collection"]], type=r.get("type") or "",
                    key=r.get("key"), content=r["content"], scores=r.get("scores", {}),
                    ready=True) for e, r in part)
                for (e, r), seq in zip(part, seqs, strict=True):
                    top[(e, r["collection"])] = max(top.get((e, r["collection"]), 0), seq)

                def watermark(derivation: str, entity: str) -> int:
                    return max(top.get((entity, c), 0) for c in sources[derivation])

                # -- core: records as they arrive, runs complete at the slice's end --
                t0 = time.perf_counter()
                fired_core: set[tuple[str, str]] = set()
                jobs: list[tuple[str, str, str]] = []
                for (e, r), seq in zip(part, seqs, strict=True):
                    st = states.get(e) or EntityState("default", e)
                    rec = Rec(seq, r["collection"], versions[r["collection"]], r.get("type") or "",
                              "active", r.get("key"), r["content"], "", False, {},
                              r.get("scores", {}), now, now)
                    step = engine.apply(st, RecordChanged("c", rec, None, seq), now)
                    states[e] = step.state
                    for d in step.dispatched:
                        fired_core.add((d.derivation, e))
                        jobs.append((d.derivation, e, d.job_id))
                for d, e, job_id in jobs:
                    states[e] = engine.apply(states[e], CursorAdvanced(
                        d, watermark(d, e), now, "succeeded", job_id), now).state
                core_s += time.perf_counter() - t0
                core_runs += len(jobs)

                # -- naive: every entity, every trigger, one query each, on the timer --
                t0 = time.perf_counter()
                fired_naive: set[tuple[str, str]] = set()
                for e in sorted(states):
                    for t, oracle in oracles.items():
                        queries += 1
                        conds = oracle.run(conn, now_dt, [e])[(t, e)]
                        if conds and all(c["holds"] for c in conds):
                            fired_naive.add((by_derivation[t], e))
                with conn.transaction():
                    for d, e in sorted(fired_naive):
                        conn.execute(
                            "INSERT INTO derivation_cursors (workspace, derivation, entity, "
                            "watermark, last_run_at, last_success_at, last_outcome) VALUES "
                            "('default', %s, %s, %s, %s, %s, 'succeeded') ON CONFLICT "
                            "(workspace, derivation, entity) DO UPDATE SET watermark = "
                            "EXCLUDED.watermark, last_run_at = EXCLUDED.last_run_at, "
                            "last_success_at = EXCLUDED.last_success_at, last_outcome = "
                            "'succeeded'", (d, e, watermark(d, e), now_dt, now_dt))
                naive_s += time.perf_counter() - t0
                naive_runs += len(fired_naive)
                if fired_core != fired_naive:
                    mismatches.append(
                        f"poll {p}: core only {sorted(fired_core - fired_naive)[:5]}, "
                        f"naive only {sorted(fired_naive - fired_core)[:5]}")
            conn.close()
            store.close()
        finally:
            pg.stop()
    n = len(stream)
    core_rate, naive_rate = n / core_s, n / naive_s
    print(f"entities={a.entities} records={n} polls={a.polls} runs: core={core_runs} "
          f"naive={naive_runs} (equal at every poll: {not mismatches})")
    print(f"core   {core_rate:>12,.0f} records/s  ({core_s:.2f} s evaluating)")
    print(f"naive  {naive_rate:>12,.0f} records/s  ({naive_s:.2f} s, {queries:,} queries, "
          f"{queries / naive_s:,.0f} queries/s)")
    for m in mismatches:
        print("MISMATCH", m, file=sys.stderr)
    print(f"ratio core/naive = {core_rate / naive_rate:.1f}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
