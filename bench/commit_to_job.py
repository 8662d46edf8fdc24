"""Commit → job latency: from a PostgreSQL commit to its job on the derive topic.

The whole trigger path as a user deploys it: PostgreSQL → CDC (the built-in relay,
or Debezium in Kafka Connect) → the changes topic → ONE conditions worker process
(``wakeline worker --role readiness --role conditions``) → a job on the derive topic.  Each
commit is one ready record of a NEW entity and the catalog has one derivation with
a plain ``write`` trigger, so every commit fires exactly one job at once (no derive
worker is needed: nothing waits on an earlier run of the same entity).

Per path and rate, on a fresh database and topics:

- relay: ``wakeline worker --role conditions --relay`` (the relay thread in the
  conditions process, as the README deploys it); ``--relay-process separate`` runs
  it in its own ``wakeline cdc relay`` process instead;
- debezium: the project's connector config streaming into the changes topic, the
  conditions worker without ``--relay``; Kafka Connect is started here unless
  ``--connect-url`` is given.

A writer process commits one ready record per transaction at the rate (autocommit
INSERT, ``enriched_at = now()``); a consumer process reads the derive topic and
stamps each job's arrival (``time.time()``).  Latency of a job = arrival − its
record's PostgreSQL commit timestamp (``source.ts_us`` of the record's change event,
read from the changes topic after the window: the commit record's timestamp, same
machine clock; ``track_commit_timestamp`` is not needed).  The client's time after
COMMIT returned is recorded too and its offset from the commit timestamp printed.
The first ``--warm`` seconds of writing are not measured; every job must arrive.
Before the measured runs, each path runs once at the highest rate for
``--warm-services`` seconds through a throw-away stack, not reported (default 15 s on
Apache Kafka: a freshly started broker JVM spends its first minutes compiling, JFR's
top thread in a 5k/s run was the C2 compiler, and a deployed broker is warm).

Each job's time is also split by the messages' CreateTime (ms): CDC (commit → change
produced), readiness (→ the ready batch holding it produced), conditions (→ job
produced), delivery (→ consumed).  Reference in the same
run: raw produce → consume latency of the same broker at the same rate
(``bench/cdc_latency.py``'s ``raw_reference``).  The PNG has the latency CDFs and the
latency over the run (a rising line is a worker falling behind).  The last line prints
the ratios.

    python bench/commit_to_job.py [--rates 1000,5000] [--seconds 10] [--paths relay,debezium]
        [--broker kafka|tansu] [--relay-process same|separate] [--connect-url URL]
        [--warm-services SECONDS]
        [--png bench/results/commit_to_job.png] [--json FILE] [--tiny]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _catalog import write as write_files  # noqa: E402
from _stack import (  # noqa: E402
    ROOT,
    Services,
    Stack,
    Worker,
    cpu_by_command,
    cpu_seconds,
    cpu_share,
    machine,
    pct,
    per_unit,
)

TARGETS = {"relay": {"p50_ms": 50.0, "p99_ms": 250.0}, "debezium": {"p99_ms": 600.0}}

CATALOG = {
    "collections/main.yaml": """
        name: main
        keyed: false
        types: [chat]
        fields:
          n: integer
    """,
    "derivations/ping.yaml": """
        name: ping
        function: benchfuncs:noop
        source: {collections: [main]}
        trigger:
          write: {}
    """,
    "benchfuncs.py": "def noop(ctx):\n    return []\n",
}


def write_catalog(root: Path) -> Path:
    return write_files(root, CATALOG)


# -- child processes ---------------------------------------------------------------


def _writer(dsn: str, prefix: str, rate: float, n: int, go: Any, out: Any) -> None:
    """Commit ``n`` ready records, one per transaction, paced at ``rate``/s; send back
    the client's time after each COMMIT returned."""
    import psycopg

    sql = ("INSERT INTO records (workspace, entity, collection, type, content, enriched_at) "
           "VALUES ('default', %s, 'main', 'chat', %s, now())")
    done: list[float] = [0.0] * n
    with psycopg.connect(dsn, autocommit=True) as db, db.cursor() as cur:
        go.wait(120)
        t0 = time.perf_counter()
        for i in range(n):
            wait = t0 + i / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            cur.execute(sql, (f"{prefix}{i:07d}", f'{{"n": {i}}}'), prepare=True)
            done[i] = time.time()
        took = time.perf_counter() - t0
    out.put({"n": n, "took": took, "after_commit": done})


def _consume_jobs(bootstrap: str, topic: str, prefix: str, expect: int, ready: Any,
                  out: Any, idle_timeout: float) -> None:
    """Read the derive topic from its current ends until ``expect`` jobs of entities
    named ``prefix…`` arrived (or nothing came for ``idle_timeout`` s)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                  "enable.auto.commit": False, "log_level": 3, "fetch.wait.max.ms": 5,
                  "fetch.min.bytes": 1, "client.id": "bench-jobs"})
    parts = c.list_topics(topic, timeout=30).topics[topic].partitions
    c.assign([TopicPartition(topic, p, c.get_watermark_offsets(
        TopicPartition(topic, p), timeout=10)[1]) for p in parts])
    c.poll(0.1)
    ready.set()
    got: dict[str, tuple[float, float]] = {}  # entity → (received, message CreateTime)
    others = dupes = 0
    last = time.monotonic()
    while len(got) < expect and time.monotonic() - last < idle_timeout:
        first = c.poll(0.1)
        for m in ([first, *c.consume(1000, 0)] if first is not None else []):
            if m.error() is not None or m.value() is None:
                continue
            now = time.time()
            entity = json.loads(m.value() or b"{}")["entity"]  # JobSpec.to_json
            last = time.monotonic()
            if not entity.startswith(prefix):
                others += 1
            elif entity in got:
                dupes += 1
            else:
                got[entity] = (now, m.timestamp()[1] / 1000)
    c.close()
    out.put({"arrived": got, "others": others, "duplicates": dupes})


# -- one measured run --------------------------------------------------------------------


def _read_topic(bootstrap: str, topic: str, wanted: Any, idle: float = 5.0,
                timeout: float = 180.0) -> None:
    """Read ``topic`` from the beginning, handing each message to ``wanted``
    until it returns True (done) or nothing came for ``idle`` seconds.  (Not bounded by
    end offsets: Tansu's ListOffsets answers stale high watermarks.)"""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-read-{topic}",
                  "enable.auto.commit": False, "log_level": 3, "fetch.wait.max.ms": 50})
    parts = c.list_topics(topic, timeout=30).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    last = time.monotonic()
    deadline = last + timeout
    try:
        while time.monotonic() - last < idle and time.monotonic() < deadline:
            for m in c.consume(5000, 0.2):
                last = time.monotonic()
                if m.error() is None and m.value() is not None and wanted(m):
                    return
    finally:
        c.close()


def _commit_times(stack: Stack, prefix: str, n: int) -> dict[str, tuple[float, float]]:
    """entity → (PostgreSQL commit timestamp (``source.ts_us``) of its record's insert,
    the change message's CreateTime), read from the changes topic after the window, so
    it costs the run nothing."""
    out: dict[str, tuple[float, float]] = {}

    def take(m: Any) -> bool:
        doc = json.loads(m.value())
        after = doc.get("after") or {}
        if (doc.get("op") == "c" and doc.get("source", {}).get("table") == "records"
                and str(after.get("entity", "")).startswith(prefix)):
            out[after["entity"]] = (doc["source"]["ts_us"] / 1e6, m.timestamp()[1] / 1000)
        return len(out) >= n

    _read_topic(stack.bootstrap, stack.topic("changes"), take)
    return out


def _ready_times(stack: Stack, prefix: str, n: int) -> dict[str, float]:
    """entity → CreateTime of the ready batch that carried its record (the readiness
    stage's hand-off to the conditions agent), read after the window."""
    from wakeline.streams import ready

    out: dict[str, float] = {}

    def take(m: Any) -> bool:
        for item in ready.decode(m.value())[1]:
            if item.entity.startswith(prefix):
                out.setdefault(item.entity, m.timestamp()[1] / 1000)
        return len(out) >= n

    _read_topic(stack.bootstrap, stack.topic("changes.ready"), take)
    return out


def _wait_jobs(stack: Stack, prefix: str, n: int, timeout: float = 120.0) -> None:
    """Until the derive topic holds jobs of ``n`` entities named ``prefix…``."""
    seen: set[str] = set()

    def take(m: Any) -> bool:
        entity = json.loads(m.value())["entity"]
        if entity.startswith(prefix):
            seen.add(entity)
        return len(seen) >= n

    _read_topic(stack.bootstrap, stack.topic("derive"), take, idle=timeout, timeout=timeout)
    if len(seen) < n:
        raise RuntimeError(f"{len(seen)} of {n} warm-up jobs reached {stack.topic('derive')}:\n"
                           + "\n".join(w.failure() for w in stack.workers))


def _cpu_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat, all cores)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]  # idle + iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(f) - idle) / hz, sum(f) / hz


def _relay_process(stack: Stack) -> Worker:
    """``wakeline cdc relay`` for the stack's topology, as a worker of the stack."""
    cmd = [sys.executable, "-m", "wakeline.cli.main", "cdc", "relay", "--topology",
           str(stack.topology), "--dsn", stack.dsn, "--bootstrap", stack.bootstrap]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                            "PYTHONPATH": str(ROOT / "src")})
    w = Worker(proc)
    stack.workers.append(w)
    return w


def measure(svc: Services, catalog: Path, path: str, rate: float, args: argparse.Namespace,
            connect: Any = None, connect_pid: int | None = None) -> dict[str, Any]:
    from wakeline.cdc.debezium import DebeziumConnector, config_from_dsn, drop_slot

    stack = svc.stack(catalog, partitions=args.partitions)
    conn = None
    t_setup = time.monotonic()
    procs: dict[str, int] = {}
    try:
        env = {"WAKELINE_STATS_INTERVAL": "1"}
        if path == "debezium":
            conn = DebeziumConnector(connect, config_from_dsn(
                stack.dsn, topic=stack.topic("changes"), slot=f"dbz_{stack.name}",
                server_name=stack.name, partitions=stack.partitions,
                snapshot_mode="initial"), name=f"bench-{stack.name}")
            conn.create()
            conn.wait_streaming(stack.dsn, stack.bootstrap, timeout=180,
                                partitions=stack.partitions)
            w = stack.worker("readiness", "conditions", env=env)
            if connect_pid:
                procs["connect"] = connect_pid
        elif args.relay_process == "same":
            w = stack.worker("readiness", "conditions", relay=True, env=env)
        else:
            # `wakeline cdc relay` in its own process.
            w = stack.worker("readiness", "conditions", env=env)
            r = _relay_process(stack)
            r.wait_for("relay: slot", timeout=120)
            procs["relay"] = r.pid
        w.wait_for("conditions ready", timeout=300)
        procs["worker"] = w.pid
        # Warm-up: connections, producer ids, metadata and the first batches, before
        # any measured commit.
        warm = 50
        stack.insert(({"entity": f"warm:{i}", "collection": "main", "type": "chat",
                       "content": {"n": i}} for i in range(warm)), batch=1)
        _wait_jobs(stack, "warm:", warm)
        setup_s = time.monotonic() - t_setup

        prefix = f"c{secrets.token_hex(2)}:"
        n_warm = int(rate * args.warm)
        n = n_warm + int(rate * args.seconds)
        ctx = mp.get_context("spawn")
        go, ready, wq, cq = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
        consumer = ctx.Process(target=_consume_jobs, args=(
            stack.bootstrap, stack.topic("derive"), prefix, n, ready, cq, args.idle_timeout))
        consumer.start()
        ready.wait(60)
        writer = ctx.Process(target=_writer, args=(stack.dsn, prefix, rate, n, go, wq))
        writer.start()
        time.sleep(0.5)  # the writer's connection is open
        cpu0 = {k: cpu_seconds(pid) for k, pid in procs.items()}
        load = [os.getloadavg()[0]]
        busy0 = _cpu_busy()
        machine0 = cpu_by_command()
        t0 = time.time()
        go.set()
        wres = wq.get(timeout=args.warm + args.seconds + 600)
        load.append(os.getloadavg()[0])
        cres = cq.get(timeout=args.idle_timeout + 900)
        drained = time.time()
        # CPU from the first commit until the last job arrived (the drain included)
        cpu_w = {k: cpu_seconds(pid) - cpu0[k] for k, pid in procs.items()}
        busy1 = _cpu_busy()
        shares = cpu_share(machine0, cpu_by_command(),
                           {pid: k for k, pid in procs.items()}
                           | {writer.pid: "writer", consumer.pid: "job consumer"})
        writer.join(30)
        consumer.join(30)
        stats = [json.loads(line.split(" ", 1)[1]) for line in w.lines
                 if line.startswith("wakeline-stats ")]
        commit_ts = _commit_times(stack, prefix, n)
        ready_ts = _ready_times(stack, prefix, n)
    finally:
        stack.stop()
        with contextlib.suppress(Exception):
            if conn is not None:
                conn.delete()
                drop_slot(stack.dsn, conn.slot)
            else:  # the relay's slot would hold WAL for the rest of the run
                drop_slot(stack.dsn, f"s_{stack.name}")

    names = [f"{prefix}{i:07d}" for i in range(n)]
    arrived = cres["arrived"]
    missing = [e for e in names if e not in arrived]
    no_ts = [e for e in names if e not in commit_ts]
    measured = [e for e in names[n_warm:] if e in arrived and e in commit_ts and e in ready_ts]
    # (commit ts, changes CreateTime, derive CreateTime, received, ready CreateTime)
    rows = sorted((commit_ts[e][0], commit_ts[e][1], arrived[e][1], arrived[e][0],
                   ready_ts[e]) for e in measured)
    lat = [recv - ct for ct, _, _, recv, _ in rows]
    # latency over time, warm-up included, every 10th job: (s since the first commit,
    # latency ms, s since the first commit when produced to changes / to derive)
    every = sorted((commit_ts[e][0], arrived[e][0], commit_ts[e][1], arrived[e][1])
                   for e in names if e in arrived and e in commit_ts)
    timeline = [(ct - every[0][0], (recv - ct) * 1000, t1 - every[0][0], t2 - every[0][0])
                for ct, recv, t1, t2 in every[::10]]
    # where the time goes, from the messages' CreateTime (ms resolution): CDC (commit →
    # produced to changes), readiness (→ its ready batch produced), conditions (→ job
    # produced to derive), delivery (→ consumed)
    stages = {"cdc": [t1 - ct for ct, t1, _, _, _ in rows],
              "readiness": [r - t1 for _, t1, _, _, r in rows],
              "conditions": [t2 - r for _, _, t2, _, r in rows],
              "delivery": [recv - t2 for _, _, t2, recv, _ in rows]}
    # the client's time after COMMIT returned, minus PostgreSQL's commit timestamp
    after = wres["after_commit"]
    offset = [after[i] - commit_ts[e][0] for i, e in enumerate(names) if e in commit_ts]
    recv = sorted(r[3] for r in rows)
    commits = [r[0] for r in rows]
    firsts = [r[3] - r[0] for r in rows if commits and r[0] < commits[0] + 1.0]
    lasts = [r[3] - r[0] for r in rows if commits and r[0] >= commits[-1] - 1.0]
    ms = 1000.0
    return {
        "path": path, "rate": rate, "written": n, "measured": len(rows),
        "arrived": len(arrived), "missing": len(missing), "no_commit_ts": len(no_ts),
        "duplicates": cres["duplicates"], "other_jobs": cres["others"],
        "commit_rate": n / wres["took"],
        "commit_rate_measured": (len(commits) - 1) / (commits[-1] - commits[0])
        if len(commits) > 1 else float("nan"),
        "job_rate": (len(recv) - 1) / (recv[-1] - recv[0]) if len(recv) > 1 else float("nan"),
        "drain_s": drained - t0 - wres["took"],
        "p50_ms": pct(lat, 0.50) * ms, "p90_ms": pct(lat, 0.90) * ms,
        "p99_ms": pct(lat, 0.99) * ms, "max_ms": max(lat) * ms if lat else float("nan"),
        "first_s_p50_ms": pct(firsts, 0.5) * ms, "last_s_p50_ms": pct(lasts, 0.5) * ms,
        "stages_ms": {k: {"p50": pct(v, 0.5) * ms, "p99": pct(v, 0.99) * ms}
                      for k, v in stages.items()},
        "after_commit_offset_p50_ms": pct(offset, 0.5) * ms,
        "after_commit_offset_p99_ms": pct(offset, 0.99) * ms,
        "cpu_pct": {k: 100 * v / (drained - t0) for k, v in cpu_w.items()},
        "worker_batches": stats[-1]["batches"] if stats else None,
        "setup_s": setup_s, "loadavg": load,
        # all cores, whole machine (this run and anything else), first commit → last job
        "machine_busy_pct": 100 * (busy1[0] - busy0[0]) / (busy1[1] - busy0[1]),
        # the same window's CPU by process, per commit written
        "machine_us_per_commit": per_unit(shares, n),
        "latencies_ms": [x * 1000 for x in lat],
        "timeline": timeline, "measured_from_s": rows[0][0] - every[0][0] if rows else 0.0,
    }


def raw(bootstrap: str, rate: float, seconds: float, warm: float) -> dict[str, Any]:
    import cdc_latency

    cdc_latency.WARM_S = warm
    return cdc_latency.raw_reference(bootstrap, rate, seconds)


# -- output ---------------------------------------------------------------------------


def label(r: dict[str, Any], relay_process: str) -> str:
    if r["path"] == "relay":
        where = "in the conditions process" if relay_process == "same" else "own process"
        return f"relay ({where}) @ {r['rate']:,.0f}/s"
    return f"Debezium @ {r['rate']:,.0f}/s"


def plot(results: list[dict[str, Any]], raws: dict[float, dict[str, Any]], png: Path,
         relay_process: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5), dpi=110,
                                  gridspec_kw={"width_ratios": [3, 2]})
    styles = {"relay": "-", "debezium": "--"}
    colors: dict[float, str] = {}
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for r in results:
        colors.setdefault(r["rate"], palette[len(colors) % len(palette)])
        xs = sorted(r["latencies_ms"])
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.plot(xs, ys, styles[r["path"]], color=colors[r["rate"]],
                label=f"{label(r, relay_process)}: p50 {r['p50_ms']:.0f}, p99 {r['p99_ms']:.0f} ms")
        tl = r.get("timeline") or []
        ax2.plot([x[0] for x in tl], [x[1] for x in tl], styles[r["path"]],
                 color=colors[r["rate"]], lw=0.9, label=label(r, relay_process))
    for rate, rr in raws.items():
        xs = sorted(rr.get("latencies_ms", []))
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], ":",
                    color=colors.get(rate, "grey"),
                    label=f"raw produce→consume @ {rate:,.0f}/s: p50 {rr['p50_ms']:.1f} ms")
    ax.set_xscale("log")
    ax.set_xlabel("latency, ms (log)")
    ax.set_ylabel("fraction of jobs")
    for y in (0.5, 0.99):
        ax.axhline(y, color="lightgrey", lw=0.8, zorder=0)
    for x, txt in ((50, "relay p50 target"), (250, "relay p99 target"),
                   (600, "Debezium p99 target")):
        ax.axvline(x, color="lightgrey", lw=0.8, ls="-.", zorder=0)
        ax.text(x, 0.98, txt, rotation=90, fontsize=7, color="grey", va="top", ha="right")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    warm = next((r["measured_from_s"] for r in results if r.get("timeline")), 0.0)
    ax2.axvspan(0, warm, color="lightgrey", alpha=0.4, lw=0)
    ax2.text(warm / 2, 0.98, "warm-up", transform=ax2.get_xaxis_transform(), fontsize=7,
             ha="center", va="top", color="grey")
    ax2.set_yscale("log")
    ax2.set_xlabel("commit time, s since the first commit")
    ax2.set_ylabel("latency, ms (log; every 10th job)")
    ax2.set_title("latency over the run (a growing line: the worker falls behind)", fontsize=9)
    ax2.legend(fontsize=7, loc="lower right")
    ax2.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)


def _raw_with_latencies(bootstrap: str, rate: float, seconds: float, warm: float
                        ) -> dict[str, Any]:
    """``raw_reference``, keeping the measured latencies for the plot."""
    import cdc_latency

    kept: list[float] = []
    orig = cdc_latency._summary

    def summary(pairs: list[tuple[float, float]], expect: int, since: float
                ) -> dict[str, float]:
        kept.extend((recv - ref) * 1000 for ref, recv in pairs if ref >= since)
        return orig(pairs, expect, since)

    cdc_latency._summary = summary
    try:
        res: dict[str, Any] = dict(raw(bootstrap, rate, seconds, warm))
    finally:
        cdc_latency._summary = orig
    res["latencies_ms"] = kept
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rates", default="1000,5000", help="commits/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    ap.add_argument("--warm", type=float, default=2.0, help="unmeasured seconds first")
    ap.add_argument("--paths", default="relay,debezium")
    ap.add_argument("--warm-services", type=float, default=None, metavar="SECONDS",
                    help="before the measured runs, drive each path at the highest rate for "
                    "this long through a throw-away stack (default 15 on Apache Kafka, whose "
                    "JVM compiles its hot paths through its first minutes, 0 on Tansu)")
    ap.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    ap.add_argument("--relay-process", choices=("same", "separate"), default="same",
                    help="relay thread in the conditions worker (same) or its own worker")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--idle-timeout", type=float, default=60.0,
                    help="give up when no job arrived for this long")
    ap.add_argument("--pg-dsn", help="superuser DSN of a PostgreSQL with wal_level=logical")
    ap.add_argument("--bootstrap", help="broker bootstrap servers")
    ap.add_argument("--connect-url", help="REST URL of a Kafka Connect worker with Debezium "
                    "(on the same broker)")
    ap.add_argument("--png", type=Path, default=ROOT / "bench" / "results" / "commit_to_job.png")
    ap.add_argument("--no-png", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke run: Tansu, relay only, 100 commits/s for 2 s, no PNG")
    args = ap.parse_args()
    if args.tiny:
        args.rates, args.seconds, args.warm, args.paths = "100", 2.0, 1.0, "relay"
        args.broker, args.no_png = "tansu", True
    if args.warm_services is None:
        args.warm_services = 15.0 if args.broker == "kafka" and not args.bootstrap else 0.0
    rates = [float(x) for x in args.rates.split(",")]
    paths = [p.strip() for p in args.paths.split(",")]
    if "debezium" in paths and args.broker != "kafka":
        ap.error("the Debezium path needs --broker kafka")
    catalog = write_catalog(Path(tempfile.mkdtemp(prefix="wl-bench-cat-")))
    results: list[dict[str, Any]] = []
    raws: dict[float, dict[str, Any]] = {}
    began = time.monotonic()
    with Services(args.broker, pg_dsn=args.pg_dsn, bootstrap=args.bootstrap) as svc, \
            contextlib.ExitStack() as stop:
        connect: Any = None
        connect_pid = None
        if "debezium" in paths:
            if args.connect_url:
                from cdc_latency import _Rest

                connect = _Rest(args.connect_url)
            else:
                from wakeline.services import KafkaConnect

                connect = KafkaConnect(svc.bootstrap, base_dir=Path(tempfile.mkdtemp(
                    prefix="wl-bench-connect-")), ephemeral=True)
                connect.up(180)
                stop.callback(connect.stop)
                connect_pid = getattr(connect, "pid", None)
        if args.warm_services > 0:
            warm_args = argparse.Namespace(**{**vars(args), "seconds": args.warm_services,
                                              "warm": 0.0})
            for path in paths:
                w = measure(svc, catalog, path, max(rates), warm_args, connect, connect_pid)
                print(f"  warmed the services: {label(w, args.relay_process)} for "
                      f"{args.warm_services:g} s, not reported (p50 {w['p50_ms']:.1f} ms, "
                      f"p99 {w['p99_ms']:.1f} ms; {time.monotonic() - began:.0f} s)", flush=True)
        for rate in rates:
            raws[rate] = _raw_with_latencies(svc.bootstrap, rate, args.seconds, args.warm)
            for path in paths:
                r = measure(svc, catalog, path, rate, args, connect, connect_pid)
                results.append(r)
                print(f"  done {label(r, args.relay_process)}: p50 {r['p50_ms']:.1f} ms, "
                      f"p99 {r['p99_ms']:.1f} ms ({time.monotonic() - began:.0f} s)",
                      flush=True)

    print(f"machine: {machine()}; broker {args.broker}, {args.partitions} partitions, one "
          f"conditions worker process; relay "
          f"{'in the conditions process' if args.relay_process == 'same' else 'in its own process'}"
          f"; {args.warm:g} s unmeasured + {args.seconds:g} s measured per run"
          + (f", after {args.warm_services:g} s per path to warm the services"
             if args.warm_services else ""))
    ok = True
    for r in results:
        complete = r["missing"] == 0 and r["no_commit_ts"] == 0 and r["duplicates"] == 0
        ok = ok and complete
        cpu = ", ".join(f"{k} {v:.0f}%" for k, v in r["cpu_pct"].items())
        print(f"[{label(r, args.relay_process)}] commits {r['commit_rate']:,.0f}/s, jobs "
              f"{r['job_rate']:,.0f}/s; {r['arrived']}/{r['written']} jobs arrived"
              f"{'' if complete else ' INCOMPLETE'} (missing {r['missing']}, duplicates "
              f"{r['duplicates']}), drained {r['drain_s']:.1f} s after the last commit; "
              f"1-min load average {r['loadavg'][0]:.1f} → {r['loadavg'][1]:.1f}, machine CPU "
              f"busy {r['machine_busy_pct']:.0f}% of {os.cpu_count()} cores")
        print(f"    p50 {r['p50_ms']:8.1f} ms  p90 {r['p90_ms']:8.1f} ms  p99 "
              f"{r['p99_ms']:8.1f} ms  max {r['max_ms']:8.1f} ms  ({r['measured']} measured); "
              f"p50 first/last second {r['first_s_p50_ms']:.1f}/{r['last_s_p50_ms']:.1f} ms; "
              f"CPU (first commit → last job, % of a core) {cpu}; COMMIT returned "
              f"{r['after_commit_offset_p50_ms']:.2f} ms "
              f"(p99 {r['after_commit_offset_p99_ms']:.2f}) after the commit timestamp")
        m = r["machine_us_per_commit"]
        print("    the machine's CPU per commit, first commit → last job: " + ", ".join(
            f"{k} {v:.0f} us" for k, v in m.items()) + f"; all {sum(m.values()):.0f} us")
        print("    stages p50/p99 ms (CreateTime): " + ", ".join(
            f"{k} {v['p50']:.1f}/{v['p99']:.1f}" for k, v in r["stages_ms"].items()))
    for rate, rr in raws.items():
        print(f"[raw produce→consume @ {rate:,.0f}/s] p50 {rr['p50_ms']:.1f} ms  p99 "
              f"{rr['p99_ms']:.1f} ms  max {rr['max_ms']:.1f} ms  {rr['events_s']:,.0f} msg/s "
              f"({rr['n']}/{rr['expected']} arrived)")
    verdicts = []
    for r in results:
        for k, limit in TARGETS.get(r["path"], {}).items():
            verdicts.append(f"{label(r, args.relay_process)} {k[:-3]} {r[k]:.0f} ms "
                            f"{'≤' if r[k] <= limit else '>'} {limit:.0f} "
                            f"{'met' if r[k] <= limit else 'MISSED'}")
    print("targets: " + "; ".join(verdicts))
    if not args.no_png:
        plot(results, raws, args.png, args.relay_process,
             f"commit → job on the derive topic, CDF ({machine()}, {args.broker})")
        print(f"wrote {args.png}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "machine": machine(),
                                         "results": [{k: v for k, v in r.items()
                                                      if k not in ("latencies_ms", "timeline")}
                                                     for r in results],
                                         "raw": {str(k): {a: b for a, b in v.items()
                                                          if a != "latencies_ms"}
                                                 for k, v in raws.items()}}, indent=1))
    print("ratio p50/p99 vs raw produce→consume at the same rate: " + "; ".join(
        f"{label(r, args.relay_process)} {r['p50_ms'] / raws[r['rate']]['p50_ms']:.1f}x/"
        f"{r['p99_ms'] / raws[r['rate']]['p99_ms']:.1f}x" for r in results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
