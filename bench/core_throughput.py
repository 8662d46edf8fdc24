"""Condition-core throughput: ready records/s through ``Engine.apply``, in process.

Workload: the mixed catalog (write+where, accumulator, census, changed) over N
entities, a stream of ready records (chat rows with priority/tags/importance,
keyed profile rewrites, contradiction relations) in random entity order, runs
completing now and then (cursor advances).  Reference, measured in the same run:
the same stream through a bare loop that decodes each record and updates one
dict per entity (the floor of per-event Python work in this process).  The cyclic
GC is tuned as in a worker process (``streams.gcpolicy.tune_gc``); with CPython's
default thresholds, collections rescanning the 100k held states cost ~20 %.

    python bench/core_throughput.py [--entities 100000] [--records 200000] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _catalog import write as write_catalog  # noqa: E402

from wakeline.catalog import compile_catalog  # noqa: E402
from wakeline.core.build import build_plan  # noqa: E402
from wakeline.core.engine import Engine  # noqa: E402
from wakeline.core.events import CursorAdvanced, RecordChanged  # noqa: E402
from wakeline.core.plan import Rec  # noqa: E402
from wakeline.core.state import EntityState  # noqa: E402
from wakeline.streams.gcpolicy import tune_gc  # noqa: E402


def workload(entities: int, records: int, seed: int = 7) -> list[tuple[str, bytes]]:
    rnd = random.Random(seed)
    out = []
    for seq in range(1, records + 1):
        e = f"user:{rnd.randrange(entities):07d}"
        r = rnd.random()
        if r < 0.8:
            row = {"seq": seq, "collection": "main", "type": "chat",
                   "content": {"priority": rnd.randint(0, 9),
                               "tags": rnd.sample(["deadline", "x", "y", "z"], 2)},
                   "scores": {"importance": rnd.randint(0, 30)}}
        elif r < 0.92:
            row = {"seq": seq, "collection": "profiles", "key": rnd.choice(["role", "city"]),
                   "content": {"value": rnd.choice(["a", "b", "c"])}}
        else:
            row = {"seq": seq, "collection": "relations", "type": "contradiction",
                   "content": {"topic": "t"}}
        out.append((e, json.dumps(row).encode()))
    return out


def to_rec(row: dict, now: float) -> Rec:
    return Rec(row["seq"], row["collection"], 1, row.get("type", ""), "active", row.get("key"),
               row["content"], "", False, {}, row.get("scores", {}), now, now)


def run_core(stream: list[tuple[str, bytes]], catalog_dir: Path) -> tuple[float, int, dict]:
    plan = build_plan(compile_catalog(catalog_dir))
    engine = Engine(plan)
    states: dict[str, EntityState] = {}
    jobs = 0
    now = 1_780_000_000.0
    t0 = time.perf_counter()
    for i, (entity, raw) in enumerate(stream):
        row = json.loads(raw)
        st = states.get(entity) or EntityState("default", entity)
        step = engine.apply(st, RecordChanged("c", to_rec(row, now), None, i + 1), now)
        st = step.state
        for d in step.dispatched:
            jobs += 1
            w = max((f.seq for f in st.facts.values() if f.ready), default=st.ds[d.derivation].w)
            st = engine.apply(st, CursorAdvanced(d.derivation, w, now, "succeeded", d.job_id),
                              now).state
        states[entity] = st
        now += 0.0001
    return time.perf_counter() - t0, jobs, states


def run_reference(stream: list[tuple[str, bytes]]) -> float:
    states: dict[str, dict] = {}
    t0 = time.perf_counter()
    for entity, raw in stream:
        row = json.loads(raw)
        s = states.setdefault(entity, {"n": 0, "max": 0})
        s["n"] += 1
        s["max"] = max(s["max"], row["seq"])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entities", type=int, default=100_000)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        a.entities, a.records = 100, 2_000
    stream = workload(a.entities, a.records)
    tune_gc()  # the cyclic GC as a worker process runs it
    with tempfile.TemporaryDirectory() as tmp:
        core_s, jobs, states = run_core(stream, write_catalog(Path(tmp)))
    ref_s = run_reference(stream)
    core_rate, ref_rate = a.records / core_s, a.records / ref_s
    print(f"entities={a.entities} records={a.records} jobs={jobs}")
    print(f"core       {core_rate:>12,.0f} records/s  ({core_s:.2f} s)")
    print(f"reference  {ref_rate:>12,.0f} records/s  ({ref_s:.2f} s)  json.loads + dict update")
    print(f"ratio core/reference = {core_rate / ref_rate:.3f}")


if __name__ == "__main__":
    main()
