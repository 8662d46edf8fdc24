"""Condition state per entity: heap objects, stored bytes, and what a worker holds.

N entities each receive a few records of the mixed catalog and a run (the
``core_throughput`` workload); the retained per-entity state is measured as:

- ``state heap``: the :class:`EntityState` objects (tracemalloc) — built only
  transiently per event by the worker;
- ``state JSON``: ``json.dumps(st.to_dict())`` bytes (the first figure kept for
  comparison), ``stored before``: what the previous ``dump_state`` wrote (compact
  JSON), ``stored now``: :func:`wakeline.core.codec.encode_state` bytes;
- ``worker-held``: what the streaming worker keeps per entity, as RSS growth of a
  fresh process that holds N entries ``state key (str) -> value`` in per-partition
  dicts (:class:`wakeline.streams.statestore.EntityStore`'s ``parts``; the value is
  the framed stored state, ``statestore.frame``: a 10-byte header with the wake-up,
  then the codec bytes) plus the entity's :class:`TimerIndex` entry when it has a
  next wakeup; measured for the previous form (compact JSON, unframed) and the
  current one.  The cost of one TimerIndex entry is printed apart (this workload
  has no timed conditions, so no entity has one).
- ``--hold-entities M`` measures the holdings at M entities (e.g. 1,000,000)
  without running the core for all of them: the N measured states' values are
  repeated in order under M distinct keys (each a separate bytes object, as in
  the worker), so the payload sizes are the workload's and the container costs
  are those of M entries.

Reference, same run: N entities holding an empty dict under the same keys, by
tracemalloc (against the heap figure) and by RSS in a fresh process (against the
worker-held figures).

    python bench/state_size.py [--entities 20000] [--hold-entities 1000000] [--tiny]
        [--no-heap]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _catalog import write as write_catalog  # noqa: E402
from core_throughput import run_core, workload  # noqa: E402

from wakeline.catalog import compile_catalog  # noqa: E402
from wakeline.core.build import build_plan  # noqa: E402
from wakeline.core.codec import decode_state, encode_state  # noqa: E402
from wakeline.core.engine import Engine  # noqa: E402
from wakeline.core.state import EntityState  # noqa: E402
from wakeline.streams.keys import entity_key, state_key  # noqa: E402
from wakeline.streams.statestore import frame  # noqa: E402

FRAME_HEAD = len(frame(b"", None, False))

_REC = struct.Struct("<HIHd")  # key length, value length (0: an empty dict), entity key length, due
_NO_DUE = float("nan")
PARTITIONS = 8


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hold(path: str) -> None:
    """Child mode: build the worker's per-entity holdings from ``path``; print the RSS growth."""
    from wakeline.streams.timers import TimerIndex

    with open(path, "rb", buffering=1 << 16) as f:
        (n,) = struct.unpack("<Q", f.read(8))
        table: dict[int, dict[str, object]] = {p: {} for p in range(PARTITIONS)}
        timers = TimerIndex()
        gc.collect()
        base = _rss()
        for i in range(n):
            kl, vl, el, due = _REC.unpack(f.read(_REC.size))
            key = f.read(kl).decode()
            table[i % PARTITIONS][key] = f.read(vl) if vl else {}
            ekey = f.read(el)
            if due == due:  # not NaN: the entity has a next wakeup
                timers.set(i % PARTITIONS, ekey, due)
        gc.collect()
        grown = _rss() - base
    print(json.dumps({"entries": sum(map(len, table.values())), "timers": len(timers),
                      "rss": grown}))


Rows = list[tuple[str, bytes | None, bytes, float | None]]


def _write_holdings(path: Path, rows: Rows) -> None:
    with open(path, "wb", buffering=1 << 16) as f:
        f.write(struct.pack("<Q", len(rows)))
        for key, value, ekey, due in rows:
            kb = key.encode()
            f.write(_REC.pack(len(kb), len(value) if value else 0, len(ekey),
                              _NO_DUE if due is None else due))
            f.write(kb)
            if value:
                f.write(value)
            f.write(ekey)


def _measure_held(path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--hold", str(path)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _old_dump(st: EntityState) -> bytes:
    # What streams/app.py's dump_state wrote before wakeline.core.codec.
    return json.dumps(st.to_dict(), separators=(",", ":")).encode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entities", type=int, default=20_000)
    ap.add_argument("--per-entity", type=int, default=4)
    ap.add_argument("--hold-entities", type=int, default=0,
                    help="measure the worker-held RSS at this many entities (the measured "
                         "states' values repeated under distinct keys); default: N")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--no-heap", action="store_true",
                    help="skip tracemalloc (the heap figure) to save time at large N")
    ap.add_argument("--hold", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hold:
        hold(a.hold)
        return
    if a.tiny:
        a.entities = 200
    t0 = time.perf_counter()
    stream = workload(a.entities, a.entities * a.per_entity)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_catalog(Path(tmp))
        used = None
        gc.collect()
        if not a.no_heap:
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
        _, _, states = run_core(stream, root)
        gc.collect()
        if not a.no_heap:
            used = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
        engine = Engine(build_plan(compile_catalog(root)))
    core_s = time.perf_counter() - t0
    del stream
    n = len(states)
    ser = sum(len(json.dumps(s.to_dict())) for s in states.values())

    rows_old: Rows = []
    rows_new: Rows = []
    rows_ref: Rows = []
    rows_due: Rows = []
    stored_old = stored_new = deflated = 0
    enc_s = dec_s = jenc_s = jdec_s = 0.0
    for s in states.values():
        skey, ekey, due = state_key(s.workspace, s.entity), entity_key(s.workspace, s.entity), \
            engine.next_wakeup(s)
        c0 = time.perf_counter()
        old = _old_dump(s)
        c1 = time.perf_counter()
        EntityState.from_dict(json.loads(old))
        c2 = time.perf_counter()
        new = encode_state(s)
        c3 = time.perf_counter()
        back = decode_state(new, s.workspace, s.entity)
        c4 = time.perf_counter()
        new = frame(new, due, False)  # what EntityStore holds
        jenc_s += c1 - c0
        jdec_s += c2 - c1
        enc_s += c3 - c2
        dec_s += c4 - c3
        assert back == s
        stored_old += len(old)
        stored_new += len(new) - FRAME_HEAD
        deflated += new[FRAME_HEAD] == 2
        rows_old.append((skey, old, ekey, due))
        rows_new.append((skey, new, ekey, due))
        rows_ref.append((skey, None, b"", None))
        rows_due.append((skey, None, ekey, 1_780_000_000.0 + len(rows_due)))
    ws = next(iter(states.values())).workspace
    del states
    m = a.hold_entities or n
    if m != n:  # the same values in order under m distinct keys
        keys = [(state_key(ws, f"user:{i:07d}"), entity_key(ws, f"user:{i:07d}"))
                for i in range(m)]
        rows_old, rows_new = ([(k, rows[i % n][1], e, rows[i % n][3])
                               for i, (k, e) in enumerate(keys)]
                              for rows in (rows_old, rows_new))
        rows_ref = [(k, None, b"", None) for k, _ in keys]
        rows_due = [(k, None, e, 1_780_000_000.0 + i) for i, (k, e) in enumerate(keys)]
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, rows in (("old", rows_old), ("new", rows_new), ("ref", rows_ref),
                           ("due", rows_due)):
            files[name] = Path(tmp) / f"{name}.bin"
            _write_holdings(files[name], rows)
        del rows_old, rows_new, rows_ref, rows_due
        gc.collect()
        held = {name: _measure_held(path) for name, path in files.items()}

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    ref: dict[str, dict] = {f"user:{i:07d}": {} for i in range(n)}
    ref_used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del ref

    per = {k: v["rss"] / m for k, v in held.items()}
    us = 1e6 / n
    print(f"entities={n} records={a.entities * a.per_entity} "
          f"timers={held['new']['timers']} core+heap {core_s:.0f} s; worker-held measured at "
          f"{m:,} entities" + (f" ({n:,} states' values repeated)" if m != n else ""))
    if used is not None:
        print(f"state heap            {used / n:>8,.0f} B/entity  (EntityState objects)")
    print(f"state JSON            {ser / n:>8,.0f} B/entity  (json.dumps(st.to_dict()))")
    print(f"stored before         {stored_old / n:>8,.0f} B/entity  (compact JSON, old dump_state)")
    print(f"stored now            {stored_new / n:>8,.0f} B/entity  (encode_state; "
          f"{deflated / n:.1%} deflated; + {FRAME_HEAD} B frame header in the store)")
    print(f"worker-held before    {per['old']:>8,.0f} B/entity  (RSS: key + JSON bytes + dict "
          f"entry + timer)")
    print(f"worker-held now       {per['new']:>8,.0f} B/entity  (RSS: key + framed encoded "
          f"bytes + dict entry + timer)")
    print(f"reference RSS         {per['ref']:>8,.0f} B/entity  (same keys, an empty dict each)")
    print(f"a timer entry         {per['due'] - per['ref']:>8,.0f} B/entity  (TimerIndex, for an "
          f"entity with a next wakeup; none here has one)" if not held["new"]["timers"] else
          f"a timer entry         {per['due'] - per['ref']:>8,.0f} B/entity  (TimerIndex, for an "
          f"entity with a next wakeup; included above)")
    print(f"reference heap        {ref_used / n:>8,.0f} B/entity  (empty dict per entity)")
    print(f"codec per state       json dump {jenc_s * us:.1f} us, load {jdec_s * us:.1f} us; "
          f"encode_state {enc_s * us:.1f} us, decode_state {dec_s * us:.1f} us")
    heap = f"; heap state/reference {used / max(ref_used, 1):.2f}" if used is not None else ""
    print(f"ratio worker-held/reference RSS = {per['new'] / max(per['ref'], 1):.2f} "
          f"(before {per['old'] / max(per['ref'], 1):.2f}{heap})")


if __name__ == "__main__":
    main()
