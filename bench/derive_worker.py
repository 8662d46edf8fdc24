"""Derive throughput per worker process: jobs/s through ``wakeline worker --role derive``.

``bench/derive_throughput.py`` measures the executor in process; this is the same
work as a deployment runs it: a worker process whose only role is ``derive`` reads
jobs from the derive topic (a librdkafka consumer, batches of up to 64 within 5 ms,
two in flight) and runs them with ``DeriveExecutor.execute_batch`` against PostgreSQL.

Workload: N entities, each with ``--records`` ready ``main`` records inserted
beforehand.  For each derivation (``noop``: the function returns ``[]``;
``upsert``: reads the entity's records and emits one keyed upsert into
``summary``), N jobs are produced to the derive topic exactly as the conditions
agent produces them (key: the entity key; value: ``JobSpec.to_json()``, a
``write`` trigger reason, attempt 1), all before the worker starts.  The figure is
jobs/s from the worker's ``derive ready`` line until PostgreSQL holds N run
rows of the derivation, and the worker's CPU per job.

Reference in the same run, on the same database and records: the bare psycopg 3
loop of ``bench/derive_throughput.py`` (``Bare.run_batch``: the same rows per job
with nothing else, one transaction per batch of 64, one set-based statement per
step), for the same derivation under another name.  ``ratio = worker / bare``.

    python bench/derive_worker.py [--broker tansu|kafka] [--entities 20000]
        [--records 2] [--batch 64] [--tiny]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stack import Services, Stack, cpu_seconds  # noqa: E402
from derive_throughput import KINDS, Bare, write_derivations  # noqa: E402

BATCH = 64


def produce_jobs(stack: Stack, derivation: str, entities: list[str]) -> None:
    from confluent_kafka import Producer

    from wakeline.derive.executor import JobSpec
    from wakeline.streams.keys import entity_key

    p = Producer({"bootstrap.servers": stack.bootstrap, "linger.ms": 5,
                  "partitioner": "murmur2_random", "log_level": 0})
    topic = stack.topic("derive")
    for e in entities:
        job = JobSpec(f"default/{derivation}/{e}/1", "default", derivation, e,
                      (f"trigger:{derivation}.default:write",), None, 1, ())
        while True:
            try:
                p.produce(topic, job.to_json(), entity_key("default", e))
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(60):
        raise RuntimeError(f"the broker did not take every job of {derivation}")


def runs_of(stack: Stack, derivation: str) -> int:
    return int(stack.query("SELECT count(*) FROM runs WHERE derivation = %s",
                           derivation)[0][0])


def measure_worker(stack: Stack, kind: str, n: int, batch: int,
                   timeout: float = 600) -> dict[str, Any]:
    w = stack.worker("derive", env={"WAKELINE_DERIVE_BATCH": str(batch)})
    w.wait_for("derive ready", timeout=300)
    t0 = time.monotonic()
    cpu0 = cpu_seconds(w.pid)
    done = 0
    while time.monotonic() - t0 < timeout:
        done = runs_of(stack, kind)
        if done >= n:
            break
        if w.proc.poll() is not None:
            raise RuntimeError("the derive worker exited:\n" + w.failure())
        time.sleep(0.05)
    dt = time.monotonic() - t0
    cpu = cpu_seconds(w.pid) - cpu0
    w.stop()
    if done < n:
        raise RuntimeError(f"{done} of {n} {kind} runs after {timeout:.0f} s:\n" + w.failure())
    bad = stack.query("SELECT outcome, count(*) FROM runs WHERE derivation = %s AND "
                      "outcome <> 'succeeded' GROUP BY outcome", kind)
    if bad:
        raise RuntimeError(f"{kind}: runs that did not succeed: {bad}")
    return {"jobs": n, "seconds": dt, "rate": n / dt, "cpu_us_per_job": 1e6 * cpu / n,
            "cpu_pct": 100 * cpu / dt}


def measure_bare(stack: Stack, kind: str, entities: list[str]) -> dict[str, Any]:
    bare = Bare(stack.dsn, upsert=kind == "upsert")
    name = f"bare_{kind}"
    try:
        t0 = time.perf_counter()
        for i in range(0, len(entities), BATCH):
            bare.run_batch(name, entities[i:i + BATCH])
        dt = time.perf_counter() - t0
    finally:
        bare.close()
    return {"jobs": len(entities), "seconds": dt, "rate": len(entities) / dt}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    ap.add_argument("--entities", type=int, default=20_000)
    ap.add_argument("--records", type=int, default=2, help="pending records per entity")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--batch", type=int, default=BATCH,
                    help="the worker's WAKELINE_DERIVE_BATCH (most jobs per batch)")
    ap.add_argument("--tiny", action="store_true", help="smoke run: Tansu, 300 entities")
    a = ap.parse_args()
    if a.tiny:
        a.broker, a.entities = "tansu", 300
    entities = [f"user:{i:07d}" for i in range(a.entities)]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, Services(a.broker) as svc:
        catalog = write_derivations(Path(tmp) / "catalog", ((k, k) for k in KINDS))
        stack = svc.stack(catalog, partitions=a.partitions)
        stack.insert({"entity": e, "collection": "main", "type": "chat",
                      "content": {"priority": r}} for e in entities for r in range(a.records))
        with psycopg.connect(stack.dsn, autocommit=True) as conn:
            conn.execute("ANALYZE records")
        for kind in KINDS:
            produce_jobs(stack, kind, entities)
            res = measure_worker(stack, kind, a.entities, a.batch)
            res["bare"] = measure_bare(stack, kind, entities)
            results[kind] = res
        stack.stop()
    print(f"machine: {os.uname().machine}, {os.cpu_count()} cores, Python "
          f"{sys.version.split()[0]}; {a.broker}, {a.entities:,} entities x {a.records} "
          f"records, {a.partitions} partitions, one derive worker process, batches of up to "
          f"{a.batch} jobs")
    for kind, r in results.items():
        print(f"  {kind:<7} worker {r['rate']:8,.0f} jobs/s ({r['seconds']:.1f} s, CPU "
              f"{r['cpu_pct']:.0f}% of a core, {r['cpu_us_per_job']:.0f} us/job); bare loop "
              f"(batches of {BATCH}) {r['bare']['rate']:8,.0f} jobs/s")
    targets = {"noop": 3000, "upsert": 1000}
    print("targets: " + "; ".join(
        f"{k} {r['rate']:,.0f} jobs/s {'>=' if r['rate'] >= targets[k] else '<'} "
        f"{targets[k]:,}: {'met' if r['rate'] >= targets[k] else 'MISSED'}"
        for k, r in results.items()))
    print("ratio worker/bare: " + ", ".join(
        f"{k} {r['rate'] / r['bare']['rate']:.2f}" for k, r in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
