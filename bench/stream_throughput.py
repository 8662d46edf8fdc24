"""Conditions throughput end to end: ready records/s through one worker process.

The changes topic is loaded first (records written to PostgreSQL and relayed by the
built-in relay, so the events are the real change envelopes), then worker
processes consume it: the readiness stage parses the envelopes into ready batches,
the conditions agent applies them to the entities' states (changelogged), sends
coalesced jobs to the derive topic and records outcomes.  Two layouts, each a fresh
consumer group over the same topic: ``one`` -- ONE process runs both roles;
``split`` -- the readiness stage runs in a second process, so the conditions
process's own cost shows.  No derive worker runs, so later stimuli of an entity
with a job in flight are coalesced into its queued job.  The figure is records/s
from the worker's "ready" line until its counters have seen every record.

References in the same run: the raw consume rate of the same topic with
confluent-kafka (``consume(10000)``, no decoding) — the ceiling the issue names —
and a bare Faust agent iterating the same topic doing nothing (bench/_faust_bare.py),
the ceiling of any per-event Faust agent on this machine.

    python bench/stream_throughput.py [--broker kafka|tansu|both] [--entities 100000]
        [--records 200000] [--partitions 4] [--layout one split] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _catalog import write as write_catalog  # noqa: E402
from _stack import (  # noqa: E402
    Services,
    Stack,
    cpu_by_command,
    cpu_seconds,
    cpu_share,
    machine,
    per_unit,
    rss_bytes,
)


def rows(entities: int, records: int, seed: int = 7) -> list[dict[str, Any]]:
    """The mixed workload of bench/core_throughput.py as records rows."""
    rnd = random.Random(seed)
    out = []
    for _ in range(records):
        e = f"user:{rnd.randrange(entities):07d}"
        r = rnd.random()
        if r < 0.8:
            out.append({"entity": e, "collection": "main", "type": "chat",
                        "content": {"priority": rnd.randint(0, 9),
                                    "tags": rnd.sample(["deadline", "x", "y", "z"], 2)},
                        "scores": {"importance": rnd.randint(0, 30)}})
        elif r < 0.92:
            out.append({"entity": e, "collection": "profiles",
                        "key": rnd.choice(["role", "city"]),
                        "content": {"value": rnd.choice(["a", "b", "c"])}})
        else:
            out.append({"entity": e, "collection": "relations", "type": "contradiction",
                        "content": {"topic": "t"}})
    return out


def driven_totals(loaded: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per entity, per derivation of the mixed catalog, how many records drive it: what
    every entity state's ``DState.total`` must say once all of them were applied (main
    rows drive urgent, reflect and reconcile; profiles rows drive skills; nothing here
    updates or deletes a record, so no total goes down)."""
    out: dict[str, dict[str, int]] = {}
    for row in loaded:
        names = {"main": ("urgent", "reflect", "reconcile"),
                 "profiles": ("skills",)}.get(row["collection"], ())
        mine = out.setdefault(row["entity"], {})
        for name in names:
            mine[name] = mine.get(name, 0) + 1
    return out


def check_answers(stack: Stack, totals: dict[str, dict[str, int]]) -> int:
    """Read the run's state changelog (the last value of each entity) and check each
    entity's per-derivation record totals against :func:`driven_totals`: a state the
    conditions agent lost or applied twice shows as a wrong total.  Returns how many
    entity states were checked; raises on the first few wrong ones."""
    from wakeline.core.codec import decode_state
    from wakeline.streams.keys import split_state_key
    from wakeline.streams.statestore import read_partition, unframe
    from wakeline.topology import load_topology

    topic = load_topology(stack.run_topology()).topics.state_changelog(stack.app_id).name
    wrong: list[str] = []
    seen: set[str] = set()
    for p in range(stack.partitions):
        data, _, _, _ = read_partition(stack.bootstrap, topic, p, f"{stack.app_id}-check")
        for skey, value in data.items():
            ws, entity = split_state_key(skey)
            st = decode_state(unframe(value)[0], ws, entity)
            got = {name: ds.total for name, ds in st.ds.items() if ds.total}
            want = totals.get(entity)
            seen.add(entity)
            if got != want and len(wrong) < 5:
                wrong.append(f"{entity}: {got} != {want}")
    missing = set(totals) - seen
    if wrong or missing:
        raise RuntimeError(f"wrong answers in the run's entity states ({len(missing)} "
                           f"entities without a state): " + "; ".join(wrong))
    return len(seen)


def raw_consume(stack: Stack, expect: int) -> dict[str, float]:
    """The ceiling: confluent-kafka reading the same topic, no decoding."""
    from confluent_kafka import Consumer

    topic = stack.topic("changes")
    c = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": f"raw-{topic}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "log_level": 0})
    c.subscribe([topic])
    n = 0
    t0 = None
    deadline = time.monotonic() + 300
    while n < expect and time.monotonic() < deadline:
        batch = c.consume(10000, 0.5)
        if batch and t0 is None:
            t0 = time.perf_counter()
        n += sum(1 for m in batch if m.error() is None)
    dt = time.perf_counter() - (t0 or time.perf_counter())
    c.close()
    return {"n": n, "seconds": dt, "rate": n / dt if dt else float("nan")}


def bare_faust(stack: Stack, expect: int) -> dict[str, float]:
    """The Faust ceiling: an agent iterating the same topic and doing nothing."""
    import os
    import subprocess

    # --without-web: Faust's worker command starts its web server on port 6066 whatever
    # the app says, and a second bare agent (or anything else there) then fails to bind
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_faust_bare.py")), "worker", "-l", "warn",
         "--without-web"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "BARE_TOPIC": stack.topic("changes"), "BARE_BOOTSTRAP": stack.bootstrap,
             "BARE_EXPECT": str(expect)})
    for line in proc.stdout.splitlines():
        if line.startswith("bare-result "):
            return dict(json.loads(line.split(" ", 1)[1]))
    raise RuntimeError("bare Faust agent gave no result:\n" + proc.stderr[-3000:])


def new_stats(w: Any, start: int) -> tuple[list[dict[str, Any]], int]:
    """The ``wakeline-stats`` lines ``w`` printed from its line ``start`` on, parsed, and
    the line the next read starts at."""
    lines = w.lines[start:]
    return ([json.loads(line.split(" ", 1)[1]) for line in lines
             if line.startswith("wakeline-stats ")], start + len(lines))


def run_workers(stack: Stack, expect: int, workers: int = 1, layout: str = "one",
                stats_interval: float = 0.1,
                totals: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """``workers`` conditions processes; records/s over what they process after the last
    one is ready (with several, the earlier ones start before: what they did until the
    last one's reload and a 2 s settle is not counted).

    ``layout``: ``one`` -- each process runs the readiness stage (change topic ->
    ready batches) and the conditions agent, as ``wakeline worker`` does by default;
    ``split`` -- one more process runs the readiness stage alone, so the conditions
    processes' own cost shows apart, and nothing flows until every conditions process
    is ready (what the sweep uses for several workers).  Every run is a fresh consumer
    group."""
    stack.run += 1
    env = {"WAKELINE_STATS_INTERVAL": str(stats_interval)}
    roles = ("readiness", "conditions") if layout == "one" else ("conditions",)
    feeder = None
    ws = []
    for _ in range(workers):
        w = stack.worker(*roles, env=env)
        w.wait_for("conditions ready", timeout=300)
        ws.append(w)
    if workers > 1:
        time.sleep(2.0)
    last: list[dict[str, Any]] = [{} for _ in ws]
    idx = [0] * len(ws)
    fidx = 0
    #: when the readiness process (split layout) had forwarded every change
    fed_at: float | None = None

    ends = stack.end_offsets(stack.topic("changes"))

    def poll() -> int:
        """Records handled: a worker's own counter, or with several (a rebalance replays
        from the last commit, so counters overlap) the group's committed offsets."""
        nonlocal fidx, fed_at
        for i, w in enumerate(ws):
            stats, idx[i] = new_stats(w, idx[i])
            if stats:
                last[i] = stats[-1]
            if w.proc.poll() is not None:
                raise RuntimeError("worker exited:\n" + w.failure())
        if feeder is not None:
            stats, fidx = new_stats(feeder, fidx)
            if fed_at is None and any((x.get("readiness") or {}).get("forwarded", 0) >= expect
                                      for x in stats):
                fed_at = time.monotonic()
        if workers == 1 or layout == "split":  # no rebalance while measuring: no replays
            return sum(x.get("events", 0) for x in last)
        done = stack.committed(stack.app_id + "-readiness", stack.topic("changes"))
        return expect - sum(max(0, end - max(0, done.get(p, 0))) for p, end in ends.items())

    if layout == "split":
        # The input starts flowing when the readiness stage has its partitions; the
        # measurement starts then, so the feeder's start-up and group join (seconds,
        # against a 10-20 s run) are not counted as the conditions process's time.
        # The feeder prints its line on assignment, before it consumes anything; the
        # line is seen up to one 20 ms poll later, so the window starts that much
        # earlier (a longer window, never a shorter one).
        feeder = stack.worker("readiness", env=env)
        seen_at = feeder.wait_for("readiness ready", timeout=300)
        applied = poll()  # the counters as of now: `first` below is the GC baseline
        if applied:
            raise RuntimeError(f"the conditions process applied {applied} records before its "
                               "feeder had its partitions: it read batches of another run")
        t0, before = seen_at - 0.02, 0
    else:
        t0 = time.monotonic()
        before = poll()
    first = [dict(x) for x in last]
    # changes the readiness stage of a one-process worker had already parsed and
    # forwarded when the measurement started: their parsing is not in its CPU figure
    early = sum((x.get("readiness") or {}).get("forwarded", 0) for x in last)
    procs = ws + ([feeder] if feeder else [])
    cpu0 = {w.pid: cpu_seconds(w.pid) for w in procs}
    machine0 = cpu_by_command()
    t_done = None
    deadline = t0 + 1800
    peak_rss = 0
    while time.monotonic() < deadline:
        seen = poll()
        peak_rss = max(peak_rss, max(rss_bytes(w.pid) for w in ws))
        if seen >= expect:
            t_done = time.monotonic()
            break
        time.sleep(0.05)
    if t_done is None:
        raise RuntimeError(f"workers saw {poll()} of {expect} records")
    cpu = sum(cpu_seconds(w.pid) - cpu0[w.pid] for w in ws)
    shares = cpu_share(machine0, cpu_by_command(),
                       {w.pid: "worker" for w in ws} | ({feeder.pid: "readiness"} if feeder
                                                        else {}))
    feeder_cpu = cpu_seconds(feeder.pid) - cpu0[feeder.pid] if feeder else 0.0
    checked = None
    if totals is not None:
        # The last batch's states are produced after its events were counted: wait until
        # no worker's state writes move for half a second before reading them back.
        settled, writes = time.monotonic(), None
        while time.monotonic() - settled < 0.5 and time.monotonic() < deadline:
            poll()
            now_writes = [x.get("state_writes", 0) for x in last]
            if now_writes != writes:
                writes, settled = now_writes, time.monotonic()
            time.sleep(stats_interval)
    for w in procs:
        w.stop()
    if totals is not None:
        checked = check_answers(stack, totals)
    dt = t_done - t0
    measured = expect - before
    if measured <= 0:
        raise RuntimeError(f"the first of {workers} workers processed every record before the "
                           "last was ready: use --layout split to measure several workers")
    by_outcome: dict[str, int] = {}
    for x in last:
        for k, v in x.get("by_outcome", {}).items():
            by_outcome[k] = by_outcome.get(k, 0) + v
    return {"workers": workers, "layout": layout, "seconds": dt, "measured": measured,
            "checked": checked,
            "rate": measured / dt,
            "jobs": sum(x.get("dispatched", 0) for x in last),
            "batches": sum(x.get("batches", 0) for x in last),
            "state_writes": sum(x.get("state_writes", 0) for x in last),
            "cpu": cpu, "cpu_pct": 100 * cpu / dt, "rss_mb": peak_rss / 2**20,
            "readiness_cpu_pct": 100 * feeder_cpu / dt,
            "us_per_record": 1e6 * cpu / measured,
            "readiness_us_per_record": 1e6 * feeder_cpu / measured,
            "by_outcome": by_outcome, "early": early,
            "fed_s": None if fed_at is None else fed_at - t0,
            # the workers' cyclic-GC collections and seconds over the window, per generation
            # (streams.gcpolicy.GC_SPENT)
            "gc": [[sum((x.get("gc") or {}).get(k, [0, 0, 0])[g] for x in last)
                    - sum((x.get("gc") or {}).get(k, [0, 0, 0])[g] for x in first)
                    for g in range(3)] for k in ("collections", "seconds")],
            "gc_longest": [max([(x.get("gc") or {}).get("longest", [0.0] * 3)[g] for x in last]
                               or [0.0]) for g in range(3)],
            "machine_us_per_record": per_unit(shares, measured),
            "machine_busy_pct": 100 * sum(shares.values()) / dt / (os.cpu_count() or 1),
            "handoff": {k: sum((x.get("handoff") or {}).get(k, 0) for x in last)
                        for k in ("kept", "taken", "dropped", "full")}}


def sweep(args: argparse.Namespace, catalog: Path) -> list[dict[str, Any]]:
    """records/s against partitions and workers (Kafka), drawn to bench/results/."""
    out = []
    with Services(args.broker if args.broker != "both" else "kafka") as svc:
        for parts in args.sweep_partitions:
            for workers in args.sweep_workers:
                if workers > parts:
                    continue
                stack = svc.stack(catalog, partitions=parts)
                loaded = rows(args.entities, args.records)
                totals = driven_totals(loaded)
                n = stack.load(loaded)
                del loaded
                res = run_workers(stack, n, workers, "split", totals=totals)
                res["partitions"] = parts
                out.append(res)
                print(f"  {parts} partitions, {workers} conditions workers: {res['rate']:8,.0f} "
                      f"records/s (CPU {res['cpu_pct']:.0f}% of a core; readiness process "
                      f"{res['readiness_cpu_pct']:.0f}%)", flush=True)
                stack.stop()
    return out


def draw_sweep(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for workers in sorted({p["workers"] for p in points}):
        pts = sorted((p["partitions"], p["rate"]) for p in points if p["workers"] == workers)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o",
                label=f"{workers} conditions process{'es' if workers > 1 else ''}")
    ax.set_xlabel("partitions of the changes topic")
    ax.set_ylabel("ready records/s (all workers)")
    ax.set_title("Conditions throughput, Apache Kafka, 2-core machine\n"
                 "(conditions workers fed by one readiness process)", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def bench(broker: str, args: argparse.Namespace, catalog: Path) -> dict[str, Any]:
    with Services(broker) as svc:
        stack = svc.stack(catalog, partitions=args.partitions)
        t = time.perf_counter()
        loaded = rows(args.entities, args.records)
        totals = driven_totals(loaded)
        n = stack.load(loaded)
        # freed before the references run: held, its ~1M objects were scanned by every
        # collection of this process's cyclic GC, and raw consume fell from ~600k to
        # ~108k records/s
        del loaded
        load_s = time.perf_counter() - t
        raw = raw_consume(stack, n)
        bare = bare_faust(stack, n)
        runs = [run_workers(stack, n, args.workers, layout, totals=totals)
                for layout in args.layout]
        return {"broker": broker, "n": n, "load_s": load_s, "raw": raw, "bare": bare,
                "worker": max(runs, key=lambda r: r["rate"]), "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--broker", choices=("kafka", "tansu", "both"), default="both")
    ap.add_argument("--entities", type=int, default=100_000)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--tiny", action="store_true", help="smoke run: Tansu, 200 entities, "
                    "1,000 records")
    ap.add_argument("--workers", type=int, default=1, help="conditions worker processes")
    ap.add_argument("--layout", nargs="+", choices=("one", "split"), default=["one", "split"],
                    help="one: readiness + conditions in each process; split: readiness in a "
                    "process of its own")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--sweep", type=Path, metavar="PNG",
                    help="instead: records/s against partitions and workers, drawn here")
    ap.add_argument("--sweep-partitions", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--sweep-workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    if args.tiny:
        args.broker, args.entities, args.records = "tansu", 200, 1000
    catalog = write_catalog(Path(tempfile.mkdtemp(prefix="wl-bench-cat-")))
    if args.sweep:
        points = sweep(args, catalog)
        draw_sweep(points, args.sweep)
        one = {p["partitions"]: p["rate"] for p in points if p["workers"] == 1}
        print(f"wrote {args.sweep}")
        print("ratio to 1 partition, 1 worker: " + ", ".join(
            f"{p['partitions']}p/{p['workers']}w {p['rate'] / one[min(one)]:.2f}"
            for p in points))
        return 0
    brokers = ("kafka", "tansu") if args.broker == "both" else (args.broker,)
    results = [bench(b, args, catalog) for b in brokers]
    print(f"machine: {machine()}; {args.entities:,} entities, {args.records:,} records, "
          f"{args.partitions} partitions, {args.workers} conditions worker process(es)")
    for r in results:
        w, raw = r["worker"], r["raw"]
        print(f"[{r['broker']}] loaded {r['n']:,} change events in {r['load_s']:.1f} s")
        print(f"  raw consume (confluent-kafka): {raw['rate']:10,.0f} records/s")
        print(f"  bare Faust agent (no work):    {r['bare']['rate']:10,.0f} records/s")
        for w in r["runs"]:
            what = ("readiness + conditions in one process" if w["layout"] == "one"
                    else "conditions process, readiness apart")
            print(f"  {what + ':':<44} {w['rate']:10,.0f} records/s "
                  f"({w['seconds']:.1f} s, {w['jobs']:,} jobs, {w['batches']:,} batches, "
                  f"{w['state_writes']:,} state writes; CPU {w['cpu_pct']:.0f}% of a core, "
                  f"{w['us_per_record']:.0f} us/record"
                  + (f"; readiness process {w['readiness_cpu_pct']:.0f}%, "
                     f"{w['readiness_us_per_record']:.0f} us/record" if w["layout"] == "split"
                     else "") + f"; peak RSS {w['rss_mb']:.0f} MiB)")
            if w.get("checked") is not None:
                print(f"    answers checked: {w['checked']:,} entity states read back from the "
                      "changelog, every per-derivation record total as loaded")
            if w.get("fed_s") is not None:
                print(f"    the readiness process had forwarded every change at "
                      f"{w['fed_s']:.1f} s of the {w['seconds']:.1f} s window")
            (n0, n1, n2), (s0, s1, s2) = w["gc"]
            if s0 + s1 + s2:
                gc_s = s0 + s1 + s2
                print(f"    cyclic GC: {gc_s:.2f} s of the worker's {w['cpu']:.1f} s of CPU "
                      f"({100 * gc_s / w['cpu']:.1f} %): generation 0 {n0} collections "
                      f"{s0:.2f} s, 1 {n1} / {s1:.2f} s, 2 {n2} / {s2:.2f} s; the longest "
                      f"since start-up " + " / ".join(f"{1000 * t:.0f}" for t in w["gc_longest"])
                      + " ms")
            m = w["machine_us_per_record"]
            print(f"    the machine's CPU per record in that window ({w['machine_busy_pct']:.0f}% "
                  f"of {os.cpu_count()} cores busy): " + ", ".join(
                      f"{k} {v:.0f} us" for k, v in m.items())
                  + f"; all {sum(m.values()):.0f} us")
        print(f"  outcomes: {w['by_outcome']}")
        if w["early"]:
            print(f"  parsed by the readiness stage before the measurement started: "
                  f"{w['early']:,} changes (their parsing is not in the CPU figure)")
        if any(w["handoff"].values()):
            h = w["handoff"]
            print(f"  ready batches handed over decoded: {h['taken']:,} of {h['kept']:,} kept "
                  f"({h['dropped']:,} dropped unused, {h['full']:,} not kept: no room)")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=1, default=str))
    print("ratio worker/raw consume: " + ", ".join(
        f"{r['broker']} {r['worker']['rate'] / r['raw']['rate']:.4f}" for r in results)
        + "; worker/bare Faust agent: " + ", ".join(
        f"{r['broker']} {r['worker']['rate'] / r['bare']['rate']:.3f}" for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
