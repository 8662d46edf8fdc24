"""Burst coalescing: a write burst over many entities, one debounced trigger.

One derivation (``burst``, a noop function) over collection ``main`` with a
``write: {}`` trigger and ``debounce_s: 1``.  ONE worker process runs every role
and the built-in relay.  Once it is ready (a warm-up record has gone all the way
to a committed run), a writer COPYs ``--writes`` ready records round-robin over
``--entities`` entities in ``--seconds`` s (equal COPY batches at a fixed pace;
the actual write duration is measured), then the benchmark waits until every
entity's derivation cursor has reached its last record (``derivation_cursors
.watermark`` vs ``max(records.seq)`` per entity) or ``--timeout``.

Printed: writes, write seconds, runs (rows of ``runs``), runs per entity
(min/max and the histogram), lost (entities whose cursor never reached their
last record: must be 0), the time from the last write until every entity was
consumed and until the conditions agent had seen every write, ``debounce``
outcomes, and the targets (runs ≤ 1,050 for 1k entities, i.e. entities × 1.05;
0 lost).

The debounce deadline is the arrival (``enriched_at``, PostgreSQL's clock) of the
entity's latest pending record + ``debounce_s`` (docs/semantics.md), compared with
the conditions agent's clock when it processes the entity's events.  When the
agent lags the writer by more than ``debounce_s`` (here: the burst is committed in
2 s and processed in about two minutes) the deadline has passed before the first
record of an entity is even processed, so the job is due at once; what keeps it one
run per entity then is the mailbox (one queued job per entity) and the run itself,
which consumes every record of the entity already in PostgreSQL, so the records
processed after it are below the watermark and fire nothing.  ``runs whose
watermark stayed below the entity's last record`` counts the runs that started
before the entity's burst was complete (a burst split in two).

Reference in the same run: the same burst through a catalog WITHOUT debounce
(runs still coalesce in the mailbox: one queued job per entity while one runs).
The last line is the ratio runs with debounce / runs without.

    python bench/burst.py [--broker tansu|kafka|both] [--entities 1000]
        [--writes 100000] [--seconds 2] [--partitions 4] [--no-reference] [--tiny]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _catalog import write as write_files  # noqa: E402
from _stack import COLUMNS, Services, Stack, cpu_seconds, machine  # noqa: E402

DERIVATION = "burst"
PREFIX = "b:"


def write_catalog(root: Path, debounce_s: float | None) -> Path:
    pacing = f"debounce_s: {debounce_s:g}\n" if debounce_s else ""
    files = {
        "collections/main.yaml": """
            name: main
            keyed: false
            types: [chat]
            fields:
              n: integer
        """,
        f"derivations/{DERIVATION}.yaml": (
            f"name: {DERIVATION}\nfunction: burstfuncs:noop\n"
            "source: {collections: [main], mode: changes}\n"
            "trigger:\n  write: {}\n" + textwrap.indent(pacing, "  ")),
        "burstfuncs.py": "def noop(ctx):\n    return []\n",
    }
    return write_files(root, files)


def entity(i: int) -> str:
    return f"{PREFIX}{i:06d}"


def write_burst(stack: Stack, entities: int, writes: int, seconds: float,
                batches: int) -> dict[str, Any]:
    """COPY ``writes`` ready records round-robin over the entities in ``batches``
    equal transactions, batch i starting at ``i * seconds / batches``."""
    per = -(-writes // batches)
    cols = ", ".join(COLUMNS)
    n = 0
    with psycopg.connect(stack.dsn) as conn:
        t0 = time.perf_counter()
        for b in range(batches):
            due = t0 + b * seconds / batches
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            with conn.cursor() as cur, cur.copy(f"COPY records ({cols}) FROM STDIN") as cp:
                for _ in range(min(per, writes - n)):
                    cp.write_row(("default", entity(n % entities), "main", "chat", None,
                                  json.dumps({"n": n}), "{}", "now()"))
                    n += 1
            conn.commit()
        t1 = time.perf_counter()
    return {"writes": n, "seconds": t1 - t0, "end": time.monotonic()}


LAGGING = """
SELECT count(*) FILTER (WHERE c.watermark IS NULL OR c.watermark < m.last),
       count(*)
FROM (SELECT entity, max(seq) AS last FROM records
      WHERE workspace = 'default' AND entity LIKE %s GROUP BY entity) m
LEFT JOIN derivation_cursors c ON c.workspace = 'default' AND c.derivation = %s
     AND c.entity = m.entity
"""


def wait_consumed(stack: Stack, timeout: float, poll: float = 0.5) -> tuple[float | None, int]:
    """(monotonic time when every entity's cursor reached its last record or None,
    entities still lagging)."""
    deadline = time.monotonic() + timeout
    lagging = -1
    while time.monotonic() < deadline:
        [(lagging, _total)] = stack.query(LAGGING, PREFIX + "%", DERIVATION)
        if lagging == 0:
            return time.monotonic(), 0
        time.sleep(poll)
    return None, int(lagging)


def wait_processed(w: Any, writes: int, settle: float, timeout: float) -> float | None:
    """Monotonic time when the worker's event counter first reached ``writes`` and
    then stayed unchanged for ``settle`` s (None on timeout)."""
    deadline = time.monotonic() + timeout
    last, since, reached = -1, time.monotonic(), None
    while time.monotonic() < deadline:
        ev = last_stats(w.lines).get("events", 0)
        now = time.monotonic()
        if ev != last:
            last, since = ev, now
        if ev >= writes and reached is None:
            reached = now
        if reached is not None and now - since >= settle:
            return reached
        if w.proc.poll() is not None:
            raise RuntimeError("worker exited:\n" + w.failure())
        time.sleep(0.1)
    return None


def warm_up(stack: Stack, timeout: float = 120) -> float:
    """One record of a warm-up entity, through relay, conditions and derive."""
    t = time.monotonic()
    stack.insert([{"entity": "warm:0", "collection": "main", "type": "chat",
                   "content": {"n": 0}}])
    deadline = t + timeout
    while time.monotonic() < deadline:
        if stack.query("SELECT 1 FROM runs WHERE entity = 'warm:0'"):
            return time.monotonic() - t
        time.sleep(0.1)
    raise RuntimeError("the warm-up record never made a run; worker output:\n"
                       + stack.workers[-1].failure())


def last_stats(lines: list[str]) -> dict[str, Any]:
    for line in reversed(lines):
        if line.startswith("wakeline-stats "):
            return json.loads(line.split(" ", 1)[1])
    return {}


def run_burst(svc: Services, catalog: Path, args: argparse.Namespace) -> dict[str, Any]:
    stack = svc.stack(catalog, partitions=args.partitions)
    w = stack.worker(relay=True, env={"WAKELINE_STATS_INTERVAL": "0.5"})
    t = time.monotonic()
    w.wait_for("conditions ready", timeout=300)
    ready_s = time.monotonic() - t
    warm_s = warm_up(stack)
    time.sleep(0.6)  # a stats line after the warm-up
    events0 = last_stats(w.lines).get("events", 0)
    cpu0 = cpu_seconds(w.pid)
    wr = write_burst(stack, args.entities, args.writes, args.seconds, args.batches)
    t_done, lost = wait_consumed(stack, args.timeout)
    # The runs read every record already in PostgreSQL, so cursors can reach the end
    # long before the conditions agent has seen every change: wait for that too (its
    # event counter past the writes and still for ``settle`` s: nothing more may run).
    t_processed = wait_processed(w, events0 + wr["writes"], args.settle, args.timeout)
    cpu = cpu_seconds(w.pid) - cpu0
    if t_done is None:  # a last look: the timeout may have cut the wait short
        t_done, lost = wait_consumed(stack, 0.0)
    per_entity = dict(stack.query(
        "SELECT entity, count(*) FROM runs WHERE derivation = %s AND entity LIKE %s "
        "GROUP BY entity", DERIVATION, PREFIX + "%"))
    counts = [per_entity.get(entity(i), 0) for i in range(args.entities)]
    [(runs, consumed, first_start, last_end)] = stack.query(
        "SELECT count(*), coalesce(sum(records_consumed), 0), min(started_at), "
        "max(finished_at) FROM runs WHERE derivation = %s AND entity LIKE %s",
        DERIVATION, PREFIX + "%")
    by_outcome = dict(stack.query(
        "SELECT outcome, count(*) FROM runs WHERE derivation = %s AND entity LIKE %s "
        "GROUP BY outcome", DERIVATION, PREFIX + "%"))
    [(debounce_outcomes,)] = stack.query(
        "SELECT count(*) FROM outcomes WHERE derivation = %s AND kind = 'debounce' "
        "AND entity LIKE %s", DERIVATION, PREFIX + "%")
    # runs that started while the writer was still writing (split bursts show here)
    [(early,)] = stack.query(
        "SELECT count(*) FROM runs r WHERE derivation = %s AND entity LIKE %s AND "
        "r.watermark_after < (SELECT max(seq) FROM records x WHERE x.workspace = r.workspace "
        "AND x.entity = r.entity)", DERIVATION, PREFIX + "%")
    stats = last_stats(w.lines)
    stack.stop()
    return {
        "ready_s": ready_s, "warm_s": warm_s, "writes": wr["writes"],
        "write_s": wr["seconds"], "runs": runs, "records_consumed": consumed,
        "runs_min": min(counts), "runs_max": max(counts),
        "histogram": dict(sorted(collections.Counter(counts).items())),
        "lost": lost, "runs_before_last_record": early,
        "consumed_after_s": (t_done - wr["end"]) if t_done else None,
        "processed_after_s": (t_processed - wr["end"]) if t_processed else None,
        "first_run_start": str(first_start), "last_run_end": str(last_end),
        "outcomes": by_outcome, "debounce_outcomes": debounce_outcomes,
        "worker_cpu_s": cpu, "worker_stats": stats,
    }


def bench(broker: str, args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="wl-bench-burst-"))
    out: dict[str, Any] = {"broker": broker}
    with Services(broker) as svc:
        out["debounce"] = run_burst(svc, write_catalog(tmp / "debounce", args.debounce), args)
        if args.reference:
            out["reference"] = run_burst(svc, write_catalog(tmp / "plain", None), args)
    return out


def describe(label: str, r: dict[str, Any], entities: int) -> list[str]:
    hist = ", ".join(f"{k} run{'s' if k != 1 else ''}: {v}" for k, v in r["histogram"].items())
    done = (f"{r['consumed_after_s']:.1f} s" if r["consumed_after_s"] is not None
            else "never (timeout)")
    proc = (f"{r['processed_after_s']:.1f} s" if r["processed_after_s"] is not None
            else "never (timeout)")
    return [
        f"  {label}:",
        f"    writes {r['writes']:,} in {r['write_s']:.2f} s "
        f"({r['writes'] / r['write_s']:,.0f}/s) over {entities:,} entities",
        f"    runs {r['runs']:,} ({r['records_consumed']:,} records consumed; outcomes "
        f"{r['outcomes']}); per entity min {r['runs_min']} max {r['runs_max']} ({hist})",
        f"    runs whose watermark stayed below the entity's last record: "
        f"{r['runs_before_last_record']:,}; debounce outcomes: {r['debounce_outcomes']:,}",
        f"    lost {r['lost']:,}; every entity consumed {done} after the last write; "
        f"the conditions agent had seen every write {proc} after it",
        f"    (worker CPU {r['worker_cpu_s']:.1f} s; worker ready in {r['ready_s']:.1f} s, "
        f"warm-up run {r['warm_s']:.1f} s)",
        f"    worker counters: events {r['worker_stats'].get('events', 0):,}, "
        f"batches {r['worker_stats'].get('batches', 0):,}, "
        f"dispatched {r['worker_stats'].get('dispatched', 0):,}, "
        f"ticks {r['worker_stats'].get('ticks', 0):,}",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--broker", choices=("kafka", "tansu", "both"), default="tansu")
    ap.add_argument("--entities", type=int, default=1000)
    ap.add_argument("--writes", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=2.0, help="write the burst in this long")
    ap.add_argument("--batches", type=int, default=20, help="COPY transactions in the burst")
    ap.add_argument("--debounce", type=float, default=1.0)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="longest wait for every entity to be consumed")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds to wait after everything was consumed before counting runs")
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="skip the burst without debounce")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke run: Tansu, 20 entities, 2,000 writes")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args()
    if args.tiny:
        args.broker, args.entities, args.writes, args.timeout = "tansu", 20, 2000, 60.0
        args.settle = 1.5
    brokers = ("kafka", "tansu") if args.broker == "both" else (args.broker,)
    results = [bench(b, args) for b in brokers]
    limit = round(args.entities * 1.05)
    print(f"machine: {machine()}; {args.writes:,} writes over {args.entities:,} entities in "
          f"{args.seconds:g} s ({args.batches} COPY batches), debounce_s {args.debounce:g}, "
          f"{args.partitions} partitions, one worker process (all roles + relay)")
    for r in results:
        print(f"[{r['broker']}]")
        for line in describe(f"with debounce_s {args.debounce:g}", r["debounce"],
                             args.entities):
            print(line)
        if "reference" in r:
            for line in describe("reference, no debounce", r["reference"], args.entities):
                print(line)
        d = r["debounce"]
        print(f"  targets: runs {d['runs']:,} <= {limit:,}: "
              f"{'met' if d['runs'] <= limit else 'MISSED'}; lost {d['lost']} == 0: "
              f"{'met' if d['lost'] == 0 else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=1, default=str))
    parts = []
    for r in results:
        d = r["debounce"]
        ref = r.get("reference")
        if ref:
            parts.append(f"{r['broker']} runs with/without debounce "
                         f"{d['runs'] / max(1, ref['runs']):.3f} ({d['runs']:,}/{ref['runs']:,})"
                         f", runs/writes {d['runs'] / d['writes']:.4f}")
        else:
            parts.append(f"{r['broker']} runs/writes {d['runs'] / d['writes']:.4f}")
    print("ratio " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
