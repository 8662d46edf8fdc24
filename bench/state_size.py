"""Condition state per entity: Python heap bytes (tracemalloc) and serialized bytes.

N entities each receive a few records of the mixed catalog and a run; the
retained per-entity state is measured.  Reference, same run: N entities holding
an empty dict in the same map (the container overhead alone).

    python bench/state_size.py [--entities 100000] [--tiny]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core_throughput import run_core, workload  # noqa: E402
from _catalog import write as write_catalog  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entities", type=int, default=100_000)
    ap.add_argument("--per-entity", type=int, default=4)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    if a.tiny:
        a.entities = 200
    stream = workload(a.entities, a.entities * a.per_entity)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_catalog(Path(tmp))
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        _, _, states = run_core(stream, root)
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
    n = len(states)
    ser = sum(len(json.dumps(s.to_dict())) for s in states.values())
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    ref = {f"user:{i:07d}": {} for i in range(n)}
    ref_used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del ref
    print(f"entities={n} records={len(stream)}")
    print(f"state heap     {used / n:>10,.0f} B/entity")
    print(f"state JSON     {ser / n:>10,.0f} B/entity")
    print(f"reference heap {ref_used / n:>10,.0f} B/entity  (empty dict per entity)")
    print(f"ratio state/reference = {used / max(ref_used, 1):.2f}")


if __name__ == "__main__":
    main()
