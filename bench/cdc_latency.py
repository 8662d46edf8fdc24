"""Commit → topic latency of the CDC path: the built-in relay and real Debezium.

One run, one machine, one database, three measurements:

1. reference: raw produce → consume latency of the broker (Apache Kafka) at the
   same message rate, with the relay's producer settings;
2. the relay (own slot, own topic) and Debezium 3.4.3 in Kafka Connect (own
   slot, own topic) streaming the SAME commits at once: a writer commits one
   ready record per transaction at ``--rate`` commits/s for ``--seconds``.

Latency of an event = time it is consumed − its commit time (``source.ts_us``,
PostgreSQL's commit timestamp; same clock).  Writer, relay and each consumer
run in their own process so they do not share a GIL.  Prints p50/p99/max and
events/s per path, then the ratios against the raw broker (last line).

    python bench/cdc_latency.py [--rate 1000] [--seconds 10] [--tiny]
        [--pg-dsn DSN --bootstrap HOST:PORT --connect-url URL]   # reuse services
        [--write bench/results/cdc_latency.md]

Without addresses it starts embedded PostgreSQL, Apache Kafka and Kafka Connect
itself (and stops them).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]


# -- child processes ----------------------------------------------------------------


def _consume(bootstrap: str, topic: str, expect: int, ready: Any, out: Any,
             timeout: float, mode: str) -> None:
    """Consume ``expect`` messages; send back per-message latency (seconds)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                  "enable.auto.commit": False, "log_level": 3, "fetch.wait.max.ms": 5,
                  "fetch.min.bytes": 1})
    meta = c.list_topics(topic, timeout=30).topics[topic]
    # Concrete start offsets (the current ends), so nothing written after
    # "ready" can be skipped by a late offset resolution.
    c.assign([TopicPartition(topic, p, c.get_watermark_offsets(
        TopicPartition(topic, p), timeout=10)[1]) for p in meta.partitions])
    c.poll(0.1)
    ready.set()
    pairs: list[tuple[float, float]] = []  # (commit or send time, receive time)
    deadline = time.monotonic() + timeout
    while len(pairs) < expect and time.monotonic() < deadline:
        first = c.poll(0.1)  # returns on the first message (consume() waits out its timeout)
        for m in ([first, *c.consume(500, 0)] if first is not None else []):
            if m.error() is not None or m.value() is None:
                continue
            now = time.time()
            if mode == "raw":
                pairs.append((float(m.value().decode()), now))  # type: ignore[union-attr]
            else:
                doc = json.loads(m.value())  # type: ignore[arg-type]
                if doc["source"]["table"] != "records" or doc["op"] != "c":
                    continue
                pairs.append((doc["source"]["ts_us"] / 1e6, now))
    c.close()
    out.put(pairs)


def _relay(dsn: str, bootstrap: str, topic: str, slot: str, started: Any, stop: Any,
           out: Any) -> None:
    from wakeline.cdc.relay import Relay

    relay = Relay(dsn, bootstrap, topic=topic, slot=slot, partitions=4)
    relay.start()
    started.set()
    began = time.process_time()
    relay.run_forever(stop)
    out.put({"cpu_s": time.process_time() - began, "polls": relay.stats.polls,
             "commits": relay.stats.commits, "failures": relay.stats.failures})
    relay.close()
    relay.drop_slot()


# -- phases ---------------------------------------------------------------------------


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _summary(pairs: list[tuple[float, float]], expect: int, since: float) -> dict[str, float]:
    """Figures over the events committed (sent) at or after ``since``."""
    kept = [(ref, recv) for ref, recv in pairs if ref >= since]
    lat = [recv - ref for ref, recv in kept]
    span = max((r for _, r in kept), default=0) - min((r for _, r in kept), default=0)
    return {"n": len(pairs), "expected": expect, "measured": len(kept),
            "p50_ms": _pct(lat, 0.50) * 1000, "p99_ms": _pct(lat, 0.99) * 1000,
            "max_ms": max(lat) * 1000 if lat else float("nan"),
            "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan"),
            "events_s": (len(lat) - 1) / span if span > 0 else float("nan")}


#: Seconds written before the measured window: the first changes after an idle
#: period are slow on Debezium (~1 s), which is not the steady-state figure.
WARM_S = 2.0


def _paced(rate: float, seconds: float, step: Any) -> tuple[int, float]:
    n = int(rate * seconds)
    t0 = time.perf_counter()
    for i in range(n):
        wait = t0 + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        step(i)
    return n, time.perf_counter() - t0


def raw_reference(bootstrap: str, rate: float, seconds: float) -> dict[str, float]:
    from confluent_kafka import Producer

    from wakeline.cdc._kafka import ensure_topic, producer_config

    topic = f"bench-raw-{secrets.token_hex(3)}"
    ensure_topic(bootstrap, topic, 4)
    n = int(rate * (seconds + WARM_S))
    ctx = mp.get_context("spawn")
    producer = Producer(producer_config(bootstrap))
    # Warm up (metadata, idempotent producer id, connections) before measuring.
    for i in range(20):
        producer.produce(topic, b"0", f"k{i}".encode())
    producer.flush(30)
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_consume, args=(bootstrap, topic, n, ready, out, seconds + 60,
                                              "raw"))
    proc.start()
    ready.wait(60)

    def send(i: int) -> None:
        producer.produce(topic, str(time.time()).encode(), f"k{i % 64}".encode())
        producer.poll(0)

    since = time.time() + WARM_S
    _paced(rate, seconds + WARM_S, send)
    producer.flush(30)
    res = out.get(timeout=seconds + 90)
    proc.join(30)
    return _summary(res, n, since)


def cdc_run(dsn: str, bootstrap: str, connect: Any, rate: float, seconds: float,
            paths: tuple[str, ...], *, connect_pid: int | None = None,
            dbz_overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """One measured window with the given paths (``relay``, ``debezium``) streaming."""
    from wakeline.cdc._kafka import ensure_topic
    from wakeline.cdc.debezium import DebeziumConnector, config_from_dsn, drop_slot

    tag = secrets.token_hex(3)
    topics = {name: f"bench-{name}-{tag}" for name in paths}
    for t in topics.values():
        ensure_topic(bootstrap, t, 4)
    out: dict[str, Any] = {"paths": paths}
    conn = None
    if "debezium" in paths:
        config = config_from_dsn(dsn, topic=topics["debezium"], slot=f"dbz_{tag}",
                                 snapshot_mode="no_data")
        config.update(dbz_overrides or {})
        conn = DebeziumConnector(connect, config, name=f"bench-{tag}")
        t0 = time.monotonic()
        conn.create()
        conn.wait_streaming(dsn, bootstrap, timeout=120)
        out["debezium_ready_s"] = time.monotonic() - t0
    n = int(rate * (seconds + WARM_S))
    ctx = mp.get_context("spawn")
    stop, started, relay_out = ctx.Event(), ctx.Event(), ctx.Queue()
    relay = None
    if "relay" in paths:
        relay = ctx.Process(target=_relay, args=(dsn, bootstrap, topics["relay"],
                                                 f"relay_{tag}", started, stop, relay_out))
        t0 = time.monotonic()
        relay.start()
        started.wait(60)
        out["relay_ready_s"] = time.monotonic() - t0
    _warm_up(dsn, bootstrap, tuple(topics.values()))
    consumers = {}
    for name, topic in topics.items():
        ready, q = ctx.Event(), ctx.Queue()
        p = ctx.Process(target=_consume, args=(bootstrap, topic, n, ready, q,
                                               seconds + 90, "cdc"))
        p.start()
        ready.wait(60)
        consumers[name] = (p, q)
    pids = {"relay": relay.pid if relay else None,
            "debezium": connect_pid if conn is not None else None}
    with psycopg.connect(dsn, autocommit=True) as db:
        sql = ("INSERT INTO records (workspace, entity, collection, type, content, text, "
               "enriched_at) VALUES ('bench', %s, 'main', 'chat', %s, 'hello', now())")
        body = json.dumps({"text": "hello", "n": 1})

        def write(i: int) -> None:
            db.execute(sql, (f"user:{i % 500}", body))

        _paced(rate, WARM_S, write)
        since = time.time()
        cpu0 = {k: _cpu_seconds(pid) for k, pid in pids.items() if pid}
        written, took = _paced(rate, seconds, write)
    for name, (_, q) in consumers.items():
        out[name] = _summary(q.get(timeout=seconds + 120), n, since)
    for k, c0 in cpu0.items():
        out[name_cpu(k)] = _cpu_seconds(pids[k]) - c0
    stop.set()
    if relay is not None:
        relay_out.get(timeout=60)
        relay.join(30)
    for p, _ in consumers.values():
        p.join(30)
    if conn is not None:
        conn.delete()
        drop_slot(dsn, conn.slot)
    out.update(written=written, write_s=took, commit_rate=written / took)
    return out


def name_cpu(path: str) -> str:
    return f"{path}_cpu_s"


def _warm_up(dsn: str, bootstrap: str, topics: tuple[str, ...], commits: int = 50) -> None:
    """Commit a few rows and wait until every topic has them: connections, producer ids
    and metadata are then in place before the measured window."""
    from confluent_kafka import Consumer, TopicPartition

    with psycopg.connect(dsn, autocommit=True) as db:
        for i in range(commits):
            db.execute("INSERT INTO records (workspace, entity, collection) VALUES "
                       "('warmup', %s, 'main')", (f"w{i}",))
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-warmup", "log_level": 3})
    deadline = time.monotonic() + 120
    try:
        for topic in topics:
            parts = c.list_topics(topic, timeout=30).topics[topic].partitions
            while sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                      for p in parts) < commits:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"warm-up commits never reached {topic}")
                time.sleep(0.05)
    finally:
        c.close()


class _Rest:
    """The bit of KafkaConnect that DebeziumConnector uses, for an external worker."""

    def __init__(self, url: str) -> None:
        self.rest_url = url.rstrip("/")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        import urllib.error
        import urllib.request

        from wakeline.errors import ServiceError

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.rest_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ServiceError(f"HTTP {exc.code}: {exc.read()!r}", status=exc.code) from exc
        return json.loads(raw) if raw else None


def _markdown(args: argparse.Namespace, raw: dict[str, float],
              runs: dict[str, dict[str, Any]]) -> str:
    def row(name: str, st: dict[str, float], run: dict[str, Any], path: str) -> str:
        cpu = run.get(name_cpu(path))
        cpu_txt = f"{100 * cpu / run['write_s']:.0f}%" if cpu is not None else "n/a"
        return (f"| {name} | {st['p50_ms']:.1f} | {st['p99_ms']:.1f} | {st['max_ms']:.1f} | "
                f"{st['events_s']:,.0f} | {st['measured']} ({st['n']}/{st['expected']}) | "
                f"{cpu_txt} |")

    cores = os.cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines = [
        f"## CDC: commit → topic latency — {datetime.now(UTC).date().isoformat()}",
        "",
        f"`bench/cdc_latency.py --rate {args.rate:g} --seconds {args.seconds:g}` on "
        f"{platform.machine()}, {cores} cores, {mem:.0f} GiB, Python "
        f"{platform.python_version()}; PostgreSQL 18 (embedded wheel), Apache Kafka 4.1.1 "
        "(KRaft, one node) and Debezium 3.4.3.Final in Kafka Connect standalone (the "
        "project's connector config), all on this machine. A writer commits one ready "
        "record per transaction at the rate; each path reads its own slot into its own "
        "4-partition topic; latency = consumed − PostgreSQL commit timestamp. Writer, relay "
        f"and consumers are separate processes. The first {WARM_S:g} s of writing are not "
        "measured (steady state); every event must still arrive. CPU = the relay process / "
        "the Connect JVM during the measured window, in % of one core.",
        "",
        "| path | p50 ms | p99 ms | max ms | events/s | measured (all/written) | CPU |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, key in (("alone", "relay"), ("alone", "debezium"), ("both at once", "both")):
        run = runs.get(key)
        if run is None:
            continue
        for path in run["paths"]:
            name = {"relay": "relay", "debezium": "Debezium"}[path]
            lines.append(row(f"{name} → Kafka ({label}, {run['commit_rate']:,.0f} commits/s)",
                             run[path], run, path))
    lines.append(f"| reference: raw produce → consume ({args.rate:g} msg/s) | "
                 f"{raw['p50_ms']:.1f} | {raw['p99_ms']:.1f} | {raw['max_ms']:.1f} | "
                 f"{raw['events_s']:,.0f} | {raw['measured']} ({raw['n']}/{raw['expected']}) | |")
    r, d = runs["relay"]["relay"], runs["debezium"]["debezium"]
    lines += ["", f"Ratios (alone, p50 over raw p50): relay {r['p50_ms'] / raw['p50_ms']:.1f}, "
              f"Debezium {d['p50_ms'] / raw['p50_ms']:.1f}; relay / Debezium: p50 "
              f"{r['p50_ms'] / d['p50_ms']:.2f}, p99 {r['p99_ms'] / d['p99_ms']:.2f}.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="commits per second")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to write")
    ap.add_argument("--tiny", action="store_true", help="smoke run: 100 commits/s for 2 s")
    ap.add_argument("--pg-dsn", help="superuser DSN of a PostgreSQL with wal_level=logical")
    ap.add_argument("--bootstrap", help="Apache Kafka bootstrap servers")
    ap.add_argument("--connect-url", help="REST URL of a Kafka Connect worker with Debezium")
    ap.add_argument("--write", type=Path, help="also write the markdown table here")
    ap.add_argument("--no-concurrent", action="store_true",
                    help="skip the window with both paths streaming at once")
    ap.add_argument("--dbz", action="append", default=[], metavar="KEY=VALUE",
                    help="override a Debezium connector setting (repeatable)")
    args = ap.parse_args()
    if args.tiny:
        args.rate, args.seconds = 100.0, 2.0
    sys.path.insert(0, str(ROOT / "src"))
    from wakeline.services import KafkaBroker, KafkaConnect, PostgresServer
    from wakeline.services.postgres import dsn_with_database
    from wakeline.store import migrate

    started: list[Any] = []
    try:
        if args.pg_dsn:
            server_dsn = args.pg_dsn
        else:
            root = Path(tempfile.mkdtemp(prefix="wl-bench-pg-"))
            root.chmod(0o755)
            pg = PostgresServer(base_dir=root, ephemeral=True)
            started.append(pg)
            pg.up(60)
            server_dsn = pg.dsn
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            kafka = KafkaBroker(base_dir=Path(tempfile.mkdtemp(prefix="wl-bench-kafka-")),
                                ephemeral=True)
            started.append(kafka)
            kafka.up(180)
            bootstrap = kafka.bootstrap
        if args.connect_url:
            connect: Any = _Rest(args.connect_url)
        else:
            connect = KafkaConnect(bootstrap, base_dir=Path(tempfile.mkdtemp(
                prefix="wl-bench-connect-")), ephemeral=True)
            started.append(connect)
            connect.up(120)
        dbname = f"wl_bench_{secrets.token_hex(3)}"
        with psycopg.connect(server_dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{dbname}"')
        dsn = dsn_with_database(server_dsn, dbname)
        migrate(dsn)
        connect_pid = getattr(connect, "pid", None)
        overrides = dict(kv.split("=", 1) for kv in args.dbz)
        runs: dict[str, dict[str, Any]] = {}
        try:
            raw = raw_reference(bootstrap, args.rate, args.seconds)
            for key, paths in (("relay", ("relay",)), ("debezium", ("debezium",)),
                               ("both", ("relay", "debezium"))):
                if key == "both" and args.no_concurrent:
                    continue
                runs[key] = cdc_run(dsn, bootstrap, connect, args.rate, args.seconds, paths,
                                    connect_pid=connect_pid, dbz_overrides=overrides)
        finally:
            with psycopg.connect(server_dsn, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    finally:
        for svc in reversed(started):
            svc.stop()

    ok = True
    for key, run in runs.items():
        print(f"[{key}] writer: {run['written']} commits in {run['write_s']:.2f}s "
              f"({run['commit_rate']:,.0f} commits/s)")
        for path in run["paths"]:
            st = run[path]
            ok = ok and st["n"] == st["expected"]
            cpu = run.get(name_cpu(path))
            cpu_txt = f"  cpu {cpu:.2f}s" if cpu is not None else ""
            print(f"  {path:>9}: p50 {st['p50_ms']:7.1f} ms  p99 {st['p99_ms']:7.1f} ms  "
                  f"max {st['max_ms']:7.1f} ms  {st['events_s']:8,.0f} events/s  "
                  f"({st['measured']} measured, {st['n']}/{st['expected']} arrived){cpu_txt}")
    print(f"raw broker: p50 {raw['p50_ms']:7.1f} ms  p99 {raw['p99_ms']:7.1f} ms  "
          f"max {raw['max_ms']:7.1f} ms  {raw['events_s']:8,.0f} events/s")
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(_markdown(args, raw, runs))
        print(f"wrote {args.write}")
    r, d = runs["relay"]["relay"], runs["debezium"]["debezium"]
    print(f"ratio p50 vs raw broker (alone): relay {r['p50_ms'] / raw['p50_ms']:.1f}x, "
          f"debezium {d['p50_ms'] / raw['p50_ms']:.1f}x; relay/debezium p50 "
          f"{r['p50_ms'] / d['p50_ms']:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
