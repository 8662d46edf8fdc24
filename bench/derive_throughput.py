"""Derive throughput: jobs/s through the derive executor against real PostgreSQL.

Workload: N entities, each with ``--records`` ready ``main`` records inserted
beforehand; one job per entity (as the conditions agent dispatches it: a
``write`` trigger reason, attempt 1).  Two derivations:

- ``noop``: the function returns ``[]`` (the executor still claims the job, reads
  the cursor and the entity's pending records, and commits the run row, the
  cursor advance and the job's terminal state);
- ``upsert``: the function reads the entity's records (``ctx.records``, read by
  the executor) and emits one keyed upsert into ``summary`` (a new head row).

Each is run with batches of ``--batches`` jobs (batch 1: ``DeriveExecutor.execute``
per job; more: ``DeriveExecutor.execute_batch``, as the derive agent hands it the
jobs that arrived together), with one executor in one thread and with two
executors in two threads (``--threads``; a worker's agent runs one batch at a
time).  Reference, in the same run on the same database: a bare psycopg 3 loop
doing the same reads and writes with nothing else (job row, cursor read, records
read, run row, output row, cursor upsert) - batch 1: one transaction per job,
plain statements; a batch of n: one transaction per n jobs, each step one
set-based statement over the batch (a round trip per step).  ``ratio = executor /
bare`` at the same batch size.  Both sides plan no sequential scans (as the
executor's session: the tables start empty, so plans made early would scan
them whole later).  Every scenario uses its own derivation name (fresh cursors)
and is repeated ``--rounds`` times interleaved with its reference; the best
round of each is reported, with the CPU it cost per job in this process (client)
and in the workers' PostgreSQL backends (server, read from /proc: the embedded
server runs on this machine).

    python bench/derive_throughput.py [--entities 3000] [--records 2] [--rounds 3]
        [--batches 1,16,64,256] [--threads 1,2] [--tiny]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FUNCS = '''
def noop(ctx):
    return []

def upsert(ctx):
    last = ctx.records[-1]
    return [{"collection": "summary", "key": "latest", "text": "",
             "content": {"n": len(ctx.records), "last": last["seq"],
                         "priority": last["content"].get("priority", 0)}}]
'''

COLLECTIONS = {
    "main": """
        name: main
        keyed: false
        types: [chat]
        fields:
          priority: integer
    """,
    "summary": """
        name: summary
        keyed: true
        fields:
          n: integer
          last: integer
          priority: integer
    """,
}

KINDS = ("noop", "upsert")
THREADS = (1, 2)
BATCHES = (1, 16, 64, 256)


def scenario(kind: str, threads: int, batch: int, r: int) -> str:
    """The derivation name of one scenario and round (its own cursors)."""
    return f"{kind}_{threads}t_b{batch}_r{r}"


def write_derivations(root: Path, derivations: Iterable[tuple[str, str]]) -> Path:
    """The catalog: the collections, the functions, and one derivation per ``(name,
    kind)`` (kind ``noop`` or ``upsert``) over ``main`` with a ``write`` trigger."""
    for sub in ("collections", "derivations"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for name, text in COLLECTIONS.items():
        (root / "collections" / f"{name}.yaml").write_text(textwrap.dedent(text))
    for name, kind in derivations:
        emits = "[summary]" if kind == "upsert" else "[]"
        (root / "derivations" / f"{name}.yaml").write_text(
            f"name: {name}\nfunction: benchfuncs:{kind}\n"
            f"source:\n  collections: [main]\n  mode: changes\n"
            f"emits: {emits}\ntrigger:\n  write: {{}}\n")
    (root / "benchfuncs.py").write_text(FUNCS)
    return root


def write_catalog(root: Path, rounds: int, threads: tuple[int, ...] = THREADS,
                  batches: tuple[int, ...] = BATCHES) -> Path:
    return write_derivations(root, ((scenario(kind, t, batch, r), kind) for kind in KINDS
                                    for t in threads for batch in batches
                                    for r in range(rounds)))


def backend_cpu(pid: int) -> float | None:
    """CPU seconds of a PostgreSQL backend process (same machine), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_threads(threads: int, jobs: list[Any], make: Callable[[], Any],
                work: Callable[[Any, list[Any]], None], batch: int = 1
                ) -> tuple[float, float, float | None]:
    """Run ``jobs`` split over ``threads`` workers (each with its own ``make()``, which
    has a ``conn``), ``work(worker, chunk)`` on chunks of ``batch`` jobs; returns
    (wall seconds, this process's CPU seconds, the workers' PostgreSQL backends' CPU
    seconds or None)."""
    workers = [make() for _ in range(threads)]
    pids = [w.conn.info.backend_pid for w in workers]
    errors: list[BaseException] = []

    def loop(w: Any, part: list[Any]) -> None:
        try:
            for i in range(0, len(part), batch):
                work(w, part[i:i + batch])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def server() -> float | None:
        cpu = [backend_cpu(p) for p in pids]
        return None if None in cpu else sum(c for c in cpu if c is not None)

    ts = [threading.Thread(target=loop, args=(w, jobs[i::threads]))
          for i, w in enumerate(workers)]
    s0 = server()
    c0, t0 = time.process_time(), time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s1 = server()
    for w in workers:
        w.close()
    if errors:
        raise errors[0]
    return wall, cpu, (s1 - s0) if s0 is not None and s1 is not None else None


class Bare:
    """The floor: the same rows per job with nothing else - one transaction per job,
    plain statements (``run``), or one per batch, a set-based statement per step
    (``run_batch``)."""

    def __init__(self, dsn: str, upsert: bool) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute("SET enable_seqscan = off")
        self.upsert = upsert

    def close(self) -> None:
        self.conn.close()

    def run(self, derivation: str, entity: str) -> None:
        from psycopg.types.json import Jsonb

        from wakeline.store.records import REC_COLUMNS

        conn = self.conn
        now = datetime.now(UTC)
        job_id = f"default/{derivation}/{entity}/1"
        with conn.transaction():
            conn.execute(
                "INSERT INTO jobs (job_id, workspace, derivation, entity, state, reasons, "
                "attempts, created_at, updated_at) VALUES (%s,'default',%s,%s,'succeeded',%s,1,"
                "%s,%s)", (job_id, derivation, entity, [f"trigger:{derivation}.default:write"],
                           now, now))
            cur = conn.execute(
                "SELECT watermark FROM derivation_cursors WHERE workspace = 'default' AND "
                "derivation = %s AND entity = %s FOR UPDATE", (derivation, entity)).fetchone()
            wm = int(cur[0]) if cur else 0
            rows = conn.execute(
                f"SELECT {REC_COLUMNS} FROM records WHERE workspace = 'default' AND entity = %s "
                "AND collection = ANY(%s) AND seq > %s ORDER BY seq",
                (entity, ["main"], wm)).fetchall()
            after = max([wm] + [r[0] for r in rows])
            (run_id,) = conn.execute(
                "INSERT INTO runs (job_id, attempt, workspace, derivation, entity, "
                "trigger_reasons, definition_hashes, outcome, started_at, finished_at, "
                "watermark_before, watermark_after, records_consumed) VALUES "
                "(%s,1,'default',%s,%s,%s,%s,'succeeded',%s,%s,%s,%s,%s) RETURNING run_id",
                (job_id, derivation, entity, [f"trigger:{derivation}.default:write"],
                 Jsonb({"catalog": "x"}), now, now, wm, after, len(rows))).fetchone()
            if self.upsert:
                conn.execute(
                    "INSERT INTO records (workspace, entity, collection, collection_version, "
                    "type, key, content, text, enriched_at, created_at, produced_by_run) VALUES "
                    "('default',%s,'summary',1,'','latest',%s,'',%s,%s,%s) RETURNING seq",
                    (entity, Jsonb({"n": len(rows), "last": after,
                                    "priority": rows[-1][6].get("priority", 0)}),
                     now, now, run_id)).fetchone()
            conn.execute(
                "INSERT INTO derivation_cursors (workspace, derivation, entity, watermark, "
                "last_run_at, last_success_at, at_handled_through, last_run_id, advance_count, "
                "last_outcome, last_job_id, updated_at) VALUES ('default',%s,%s,%s,%s,%s,%s,%s,"
                "1,'succeeded',%s,%s) ON CONFLICT (workspace, derivation, entity) DO UPDATE SET "
                "watermark = EXCLUDED.watermark, last_run_at = EXCLUDED.last_run_at, "
                "last_success_at = EXCLUDED.last_success_at, at_handled_through = "
                "EXCLUDED.at_handled_through, last_run_id = EXCLUDED.last_run_id, "
                "advance_count = derivation_cursors.advance_count + 1, last_outcome = "
                "EXCLUDED.last_outcome, last_job_id = EXCLUDED.last_job_id, updated_at = "
                "EXCLUDED.updated_at",
                (derivation, entity, after, now, now, now, run_id, job_id, now))


    def run_batch(self, derivation: str, entities: list[str]) -> None:
        from psycopg.types.json import Jsonb

        conn = self.conn
        now = datetime.now(UTC)
        job_ids = [f"default/{derivation}/{e}/1" for e in entities]
        reasons = [f"trigger:{derivation}.default:write"]
        with conn.transaction():
            conn.execute(
                "INSERT INTO jobs (job_id, workspace, derivation, entity, state, reasons, "
                "attempts, created_at, updated_at) SELECT j, 'default', %s, e, 'succeeded', "
                "%s, 1, %s, %s FROM unnest(%s::text[], %s::text[]) AS t(j, e)",
                (derivation, reasons, now, now, job_ids, entities))
            wm = dict.fromkeys(entities, 0)
            wm.update(conn.execute(
                "SELECT entity, watermark FROM derivation_cursors WHERE workspace = 'default' "
                "AND derivation = %s AND entity = ANY(%s) ORDER BY entity FOR UPDATE",
                (derivation, entities)).fetchall())
            rows: dict[str, list[tuple[int, Any]]] = {e: [] for e in entities}
            for e, seq, content in conn.execute(
                    "SELECT r.entity, r.seq, r.content FROM unnest(%s::text[], %s::bigint[]) "
                    "AS w(entity, wm) JOIN records r ON r.workspace = 'default' "
                    "AND r.entity = w.entity AND r.collection = ANY(%s) AND r.seq > w.wm "
                    "ORDER BY r.entity, r.seq",
                    (entities, [wm[e] for e in entities], ["main"])).fetchall():
                rows[e].append((seq, content))
            after = [max([wm[e]] + [seq for seq, _ in rows[e]]) for e in entities]
            run_ids = dict(conn.execute(
                "INSERT INTO runs (job_id, attempt, workspace, derivation, entity, "
                "trigger_reasons, definition_hashes, outcome, started_at, finished_at, "
                "watermark_before, watermark_after, records_consumed) SELECT j, 1, 'default', "
                "%s, e, %s, %s, 'succeeded', %s, %s, b, a, n FROM unnest(%s::text[], "
                "%s::text[], %s::bigint[], %s::bigint[], %s::int[]) AS t(j, e, b, a, n) "
                "RETURNING entity, run_id",
                (derivation, reasons, Jsonb({"catalog": "x"}), now, now, job_ids, entities,
                 [wm[e] for e in entities], after, [len(rows[e]) for e in entities])
            ).fetchall())
            if self.upsert:
                conn.execute(
                    "INSERT INTO records (workspace, entity, collection, collection_version, "
                    "type, key, content, text, enriched_at, created_at, produced_by_run) "
                    "SELECT 'default', e, 'summary', 1, '', 'latest', c, '', %s, %s, r "
                    "FROM unnest(%s::text[], %s::jsonb[], %s::bigint[]) AS t(e, c, r)",
                    (now, now, entities,
                     [Jsonb({"n": len(rows[e]), "last": a,
                             "priority": rows[e][-1][1].get("priority", 0)})
                      for e, a in zip(entities, after, strict=True)],
                     [run_ids[e] for e in entities]))
            conn.execute(
                "INSERT INTO derivation_cursors (workspace, derivation, entity, watermark, "
                "last_run_at, last_success_at, at_handled_through, last_run_id, advance_count, "
                "last_outcome, last_job_id, updated_at) SELECT 'default', %s, e, a, %s, %s, %s, "
                "r, 1, 'succeeded', j, %s FROM unnest(%s::text[], %s::bigint[], %s::bigint[], "
                "%s::text[]) AS t(e, a, r, j) ORDER BY e ON CONFLICT (workspace, derivation, "
                "entity) DO UPDATE SET watermark = EXCLUDED.watermark, last_run_at = "
                "EXCLUDED.last_run_at, last_success_at = EXCLUDED.last_success_at, "
                "at_handled_through = EXCLUDED.at_handled_through, last_run_id = "
                "EXCLUDED.last_run_id, advance_count = derivation_cursors.advance_count + 1, "
                "last_outcome = EXCLUDED.last_outcome, last_job_id = EXCLUDED.last_job_id, "
                "updated_at = EXCLUDED.updated_at",
                (derivation, now, now, now, now, entities, after,
                 [run_ids[e] for e in entities], job_ids))


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entities", type=int, default=3_000)
    ap.add_argument("--records", type=int, default=2, help="pending records per entity")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=ints, default=BATCHES,
                    help="jobs per batch, comma-separated (default 1,16,64,256)")
    ap.add_argument("--threads", type=ints, default=THREADS,
                    help="executors in threads, comma-separated (default 1,2)")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        a.entities, a.rounds = 60, 1

    import psycopg

    from wakeline.catalog import compile_catalog
    from wakeline.core.build import build_plan
    from wakeline.derive import DeriveExecutor, JobSpec
    from wakeline.services import PostgresServer
    from wakeline.store import Store, migrate
    from wakeline.store.records import NewRecord

    entities = [f"user:{i:07d}" for i in range(a.entities)]
    # (side, kind, threads, batch) -> (wall, client CPU, server CPU) of the best round
    best: dict[tuple[str, str, int, int], tuple[float, float, float | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the embedded server may run as another user
        catalog = compile_catalog(write_catalog(root / "catalog", a.rounds, a.threads,
                                                a.batches))
        plan = build_plan(catalog)
        pg = PostgresServer(base_dir=root / "pg", ephemeral=True)
        pg.up(120)
        try:
            dsn = pg.create_database("derive")
            migrate(dsn)
            store = Store.connect(dsn)
            store.insert_records(
                NewRecord(workspace="default", entity=e, collection="main", type="chat",
                          content={"priority": i % 10}, ready=True)
                for i in range(a.records) for e in entities)
            store.close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")

            for r in range(a.rounds):
                for kind in KINDS:
                    for threads in a.threads:
                        for batch in a.batches:
                            name = scenario(kind, threads, batch, r)
                            jobs = [JobSpec(f"default/{name}/{e}/1", "default", name, e,
                                            (f"trigger:{name}.default:write",))
                                    for e in entities]
                            outcomes: list[str] = []

                            def work(ex: Any, chunk: list[JobSpec],
                                     outcomes: list[str] = outcomes) -> None:
                                if len(chunk) == 1:
                                    outcomes.append(ex.execute(chunk[0]).outcome)
                                    return
                                for answer in ex.execute_batch(chunk):
                                    outcomes.append(answer.outcome
                                                    if not isinstance(answer, Exception)
                                                    else repr(answer))

                            def bare(b: Bare, chunk: list[JobSpec]) -> None:
                                if len(chunk) == 1:
                                    b.run("bare_" + chunk[0].derivation, chunk[0].entity)
                                else:
                                    b.run_batch("bare_" + chunk[0].derivation,
                                                [j.entity for j in chunk])

                            sides = {
                                "executor": (lambda: DeriveExecutor(catalog, dsn, plan=plan),
                                             work),
                                "bare": (lambda kind=kind: Bare(dsn, kind == "upsert"), bare),
                            }
                            for side, (make, fn) in sides.items():
                                wall, cpu, server = run_threads(threads, jobs, make, fn, batch)
                                key = (side, kind, threads, batch)
                                if key not in best or wall < best[key][0]:
                                    best[key] = (wall, cpu, server)
                            bad = [o for o in outcomes if o != "succeeded"]
                            if bad or len(outcomes) != len(jobs):
                                print(f"unexpected outcomes in {name}: {sorted(set(bad))}",
                                      file=sys.stderr)
                                return 1
        finally:
            pg.stop()

    n = a.entities
    print(f"entities={n} records/entity={a.records} rounds={a.rounds} (best round shown; "
          "CPU in ms per job: client = this process, server = the workers' PostgreSQL "
          "backends; bare: one transaction per job at batch 1, per batch above)")
    print(f"{'derivation':<10} {'threads':>7} {'batch':>5} {'executor jobs/s':>16} "
          f"{'client':>7} {'server':>7} {'bare jobs/s':>12} {'client':>7} {'server':>7} "
          f"{'ratio':>6}")

    def ms(sec: float | None) -> str:
        return f"{1000 * sec / n:>7.3f}" if sec is not None else f"{'?':>7}"

    ratios = []
    for kind in KINDS:
        for threads in a.threads:
            for batch in a.batches:
                ew, ec, es = best[("executor", kind, threads, batch)]
                bw, bc, bs = best[("bare", kind, threads, batch)]
                ratio = (n / ew) / (n / bw)
                ratios.append(f"{kind} {threads}t b{batch} {ratio:.2f}")
                print(f"{kind:<10} {threads:>7} {batch:>5} {n / ew:>16,.0f} {ms(ec)} {ms(es)} "
                      f"{n / bw:>12,.0f} {ms(bc)} {ms(bs)} {ratio:>6.2f}")
    for kind, target in (("noop", 3000), ("upsert", 1000)):
        rate, batch = max((n / best[("executor", kind, 1, b)][0], b) for b in a.batches)
        bare1 = n / best[("bare", kind, 1, 1)][0] if 1 in a.batches else None
        print(f"target {kind} >= {target:,} jobs/s per worker (1 thread): best {rate:,.0f} at "
              f"batch {batch} ({'met' if rate >= target else 'not met'})"
              + (f"; bare one transaction per job: {bare1:,.0f}" if bare1 else ""))
    print("ratio executor/bare (same batch): " + ", ".join(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
