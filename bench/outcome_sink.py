"""Outcome sink: typed outcomes/s into PostgreSQL, and what recording them costs the stream.

A conditions worker records ~1.6 outcomes per change (every non-fire is a typed,
recorded outcome), so the sink is on its hot path twice: ``put`` runs on the agent's
thread, and the writer thread competes with it for the GIL.  N outcomes shaped like
the conditions workload's (``census_below`` / ``below_threshold`` / ``no_pending``,
three per evaluation sharing one instant, small details) are handed to
:class:`wakeline.streams.sinks.OutcomeWriter` in chunks of 32 (one agent batch), then
the writer is closed, which waits until everything is written; the table is counted.
The writer's queue is sized to hold the whole run: handed over this fast, the default
bound (200,000) would drop and count the overflow instead, which is not measured here.

Figures: outcomes/s until all are in the table; CPU of the whole process per outcome
(both threads); the stream's own cost per outcome (``put``, measured on its thread).

Reference, same run, same rows into a fresh table: the plain psycopg way a user would
write it — one ``COPY ... FROM STDIN`` per 5,000 rows through ``copy.write_row``
(psycopg adapts each value; details by ``json.dumps``), done on the calling thread.

    python bench/outcome_sink.py [--outcomes 300000] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from _stack import machine  # noqa: E402

from wakeline.core.outcomes import Outcome, OutcomeKind  # noqa: E402
from wakeline.services import PostgresServer  # noqa: E402
from wakeline.services.postgres import dsn_with_database  # noqa: E402
from wakeline.store import migrate  # noqa: E402

CHUNK = 32


def workload(n: int) -> list[list[Outcome]]:
    """``n`` outcomes in agent-batch chunks; each evaluation's three share one instant."""
    t0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
    out: list[Outcome] = []
    for i in range(0, n, 3):
        at = t0 + timedelta(microseconds=i)
        ent = f"user:{i % 100_000:06d}"
        out += [
            Outcome(OutcomeKind.CENSUS_BELOW, "census below min", at, "default", ent,
                    "profile", "profile.census", {"count": i % 7, "min": 10}),
            Outcome(OutcomeKind.BELOW_THRESHOLD, "accumulator below threshold", at,
                    "default", ent, "digest", "digest.default",
                    {"value": (i % 50) / 2, "threshold": 100.0}),
            Outcome(OutcomeKind.NO_PENDING, "no pending records", at, "default", ent,
                    "summary", "summary.default"),
        ]
    out = out[:n]
    return [out[i:i + CHUNK] for i in range(0, len(out), CHUNK)]


def fresh_db(admin_dsn: str, name: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    dsn = dsn_with_database(admin_dsn, name)
    migrate(dsn)
    return dsn


def count(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT count(*) FROM outcomes").fetchone()
        assert row is not None
        return int(row[0])


def run_writer(dsn: str, chunks: list[list[Outcome]]) -> dict[str, float]:
    from wakeline.streams.sinks import OutcomeWriter

    # a queue that holds the whole run: this measures the writer, not its overload rule
    w = OutcomeWriter(dsn, maxsize=sum(map(len, chunks)) + 1)
    # what the stream pays: put() on this thread (thread_time excludes the writer thread)
    c0, p0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
    for chunk in chunks:
        w.put(chunk)
    put_cpu = time.thread_time() - c0
    w.close(timeout=600)
    wall, cpu = time.perf_counter() - t0, time.process_time() - p0
    return {"wall": wall, "cpu": cpu, "put_cpu": put_cpu, "dropped": w.dropped}


def run_reference(dsn: str, chunks: list[list[Outcome]]) -> dict[str, float]:
    rows = [o for chunk in chunks for o in chunk]
    p0, t0 = time.process_time(), time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(0, len(rows), 5000):
            with conn.cursor() as cur, cur.copy(
                    "COPY outcomes (workspace, derivation, trigger, entity, kind, reason, "
                    "detail, at) FROM STDIN") as copy:
                for o in rows[i:i + 5000]:
                    copy.write_row((o.workspace, o.derivation, o.trigger, o.entity,
                                    str(o.kind), o.reason, json.dumps(o.detail), o.at))
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - p0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outcomes", type=int, default=300_000)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    n = 3_000 if a.tiny else a.outcomes
    chunks = workload(n)
    print(f"machine: {machine()}; {n:,} outcomes in chunks of {CHUNK}")
    root = Path(tempfile.mkdtemp(prefix="wl-bench-pg-"))
    root.chmod(0o755)
    with PostgresServer(base_dir=root, ephemeral=True) as pg:
        ref_dsn, wl_dsn = fresh_db(pg.dsn, "ref"), fresh_db(pg.dsn, "wl")
        ref = run_reference(ref_dsn, chunks)
        wl = run_writer(wl_dsn, chunks)
        got_ref, got_wl = count(ref_dsn), count(wl_dsn)
    if got_ref != n or got_wl != n or wl["dropped"]:
        raise SystemExit(f"rows lost: reference wrote {got_ref} of {n}, the writer {got_wl} "
                         f"(dropped {wl['dropped']})")
    us = 1e6 / n
    print(f"  reference (psycopg COPY write_row, caller's thread): {n / ref['wall']:>9,.0f} "
          f"outcomes/s, CPU {ref['cpu'] * us:5.2f} us/outcome, all of it on the caller's thread")
    print(f"  OutcomeWriter (put + background COPY):               {n / wl['wall']:>9,.0f} "
          f"outcomes/s, CPU {wl['cpu'] * us:5.2f} us/outcome, on the stream's thread "
          f"{wl['put_cpu'] * us:5.2f} us/outcome")
    print(f"  rows checked in PostgreSQL: {got_wl:,} and {got_ref:,}")
    print(f"ratio OutcomeWriter/reference: throughput {ref['wall'] / wl['wall']:.2f}x, "
          f"process CPU {wl['cpu'] / ref['cpu']:.2f}x, stream-thread CPU "
          f"{wl['put_cpu'] / ref['cpu']:.3f}x")


if __name__ == "__main__":
    main()
