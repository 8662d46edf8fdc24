"""Shared harness of the streaming benchmarks: services, a database, a topology, workers.

``Services(broker)`` starts embedded PostgreSQL and a broker (``"kafka"``: Apache
Kafka 4.x in KRaft mode, ``"tansu"``: Tansu) unless addresses are given, and stops
what it started.  ``Services.stack(catalog_dir)`` makes a fresh database (migrated)
and a topology with unique topic names; ``Stack.worker(roles)`` runs a worker
process (``wakeline worker``) and ``Stack.load(rows)`` writes records and relays
them into the changes topic with the built-in relay, so a benchmark can measure a
worker against a topic that already holds its input.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

#: The columns a benchmark row may set (records table), in COPY order.
COLUMNS = ("workspace", "entity", "collection", "type", "key", "content", "scores",
           "enriched_at")


def machine() -> str:
    import platform

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB, "
            f"Python {platform.python_version()}")


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_command() -> dict[tuple[int, str], float]:
    """User + system CPU so far of every process on the machine, by (pid, command name):
    two snapshots' difference (:func:`cpu_share`) says where a window's CPU went."""
    out = {}
    tck = os.sysconf("SC_CLK_TCK")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            head, _, rest = (d / "stat").read_text().rpartition(")")
        except OSError:  # exited meanwhile
            continue
        fields = rest.split()
        out[(int(d.name), head.partition("(")[2])] = (int(fields[11]) + int(fields[12])) / tck
    return out


#: command names grouped under one label (kernel threads, a versioned broker binary)
_COMMANDS = {"kworker": "kernel", "ksoftirqd": "kernel", "kdamond.0": "kernel",
             "kswapd0": "kernel", "rcu_preempt": "kernel", "kcompactd0": "kernel",
             "tansu": "tansu", "python": "bench script", "python3": "bench script"}


def cpu_share(before: dict[tuple[int, str], float], after: dict[tuple[int, str], float],
              names: dict[int, str]) -> dict[str, float]:
    """CPU seconds between two :func:`cpu_by_command` snapshots, by what ran: ``names``
    labels known pids (the workers); the rest by command (``java`` is Kafka and Kafka
    Connect, ``postgres`` every PostgreSQL backend); a process that exited inside the
    window is not counted.

    Matched by pid alone: a kernel worker's command name carries the work queue it
    serves at the moment (``kworker/u4:2-events_unbound``, then ``-flush``), and matched
    by (pid, name) a renamed one counted the CPU of its whole life in the window (a
    window's machine once added up to 122 % of 2 cores)."""
    out: dict[str, float] = {}
    was = {pid: t for (pid, _), t in before.items()}
    for (pid, comm), t in after.items():
        dt = t - was.get(pid, 0.0)
        if dt > 0:
            label = names.get(pid) or _COMMANDS.get(comm.split("/")[0].split("-")[0], comm)
            out[label] = out.get(label, 0.0) + dt
    return out


def per_unit(shares: dict[str, float], units: int) -> dict[str, float]:
    """:func:`cpu_share`'s seconds as µs per record / commit, largest first, without the
    processes under 0.5 µs."""
    return {k: 1e6 * v / units for k, v in sorted(shares.items(), key=lambda kv: -kv[1])
            if 1e6 * v / units >= 0.5}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def failure(self) -> str:
        """The output worth showing when the worker failed: from its first error line
        (60 lines of it) and its last 20 lines."""
        lines = list(self.lines)
        first = next((i for i, line in enumerate(lines)
                      if "Traceback" in line or "[ERROR]" in line or "[CRITICAL]" in line),
                     len(lines))
        head = lines[first:first + 60]
        tail = lines[max(first + 60, len(lines) - 20):]
        full = Path(tempfile.gettempdir()) / f"wakeline-bench-worker-{self.pid}.log"
        full.write_text("\n".join(lines) + "\n")
        return "\n".join(head + (["..."] if tail else []) + tail + [f"(whole output: {full})"])

    def wait_for(self, text: str, timeout: float = 120.0, after: int = 0) -> float:
        """Wait until a line (from index ``after``) contains ``text``; its time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines[after:]):
                return time.monotonic()
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"worker never printed {text!r}; output:\n" + self.failure())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


#: the topics each run of a stack has of its own (Stack.run_topology)
_PER_RUN = ("changes.ready", "stimuli")


@dataclass
class Stack:
    dsn: str
    bootstrap: str
    name: str
    topology: Path
    catalog: Path
    partitions: int
    workers: list[Worker] = field(default_factory=list)
    #: bump to run workers of a fresh consumer group (and state) over the same topics
    run: int = 0

    @property
    def app_id(self) -> str:
        return f"wl-{self.name}" + (f"-r{self.run}" if self.run else "")

    def run_topology(self) -> Path:
        """The topology of the current run: from the second run on, the same changes
        topic with a ready and a stimuli topic of the run's own (:meth:`topic`).  A
        fresh consumer group reads its topics from the beginning, so on shared ones the
        conditions agent of a later run also applied every earlier run's ready batches
        (taken up before its feeder had started, they made its records/s and CPU per
        record look better)."""
        if not self.run:
            return self.topology
        path = self.topology.with_name(f"{self.topology.stem}-r{self.run}.yaml")
        if not path.exists():
            doc = yaml.safe_load(self.topology.read_text())
            doc["topics"]["ready"] = self.topic("changes.ready")
            doc["topics"]["stimuli"] = {**doc["topics"]["stimuli"],
                                        "name": self.topic("stimuli")}
            path.write_text(yaml.safe_dump(doc))
        return path

    def topic(self, kind: str) -> str:
        """The current run's topic of ``kind`` (``changes``, ``changes.ready``,
        ``stimuli``, ...); the ready and stimuli topics are a run's own."""
        name = f"{self.name}.{kind}"
        return f"{name}.r{self.run}" if self.run and kind in _PER_RUN else name

    def worker(self, *roles: str, relay: bool = False, env: dict[str, str] | None = None,
               print_runs: bool = False) -> Worker:
        cmd = [sys.executable, "-m", "wakeline.cli.main", "worker", "--topology",
               str(self.run_topology()), "--catalog", str(self.catalog), "--dsn", self.dsn,
               "--bootstrap", self.bootstrap, "--app-id", self.app_id]
        if print_runs:
            cmd.append("--print-runs")
        for r in roles or ("all",):
            cmd += ["--role", r]
        if relay:
            cmd.append("--relay")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                "PYTHONPATH": str(ROOT / "src"), **(env or {})})
        w = Worker(proc)
        self.workers.append(w)
        return w

    def ensure_topics(self) -> None:
        from wakeline.cdc._kafka import ensure_topic

        for kind in ("changes", "stimuli", "derive"):
            ensure_topic(self.bootstrap, self.topic(kind), self.partitions)
        ensure_topic(self.bootstrap, self.topic("dead_letter"), 1)
        ensure_topic(self.bootstrap, self.topic("changes") + ".cron", 1)

    def insert(self, rows: Iterable[dict[str, Any]], batch: int = 5000) -> int:
        """COPY rows into ``records`` (ready: ``enriched_at`` = now), ``batch`` per
        transaction.  Returns the number written."""
        n = 0
        with psycopg.connect(self.dsn) as conn:
            buf: list[tuple[Any, ...]] = []

            def flush() -> None:
                with conn.cursor() as cur, cur.copy(
                        f"COPY records ({', '.join(COLUMNS)}) FROM STDIN") as cp:
                    for r in buf:
                        cp.write_row(r)
                conn.commit()
                buf.clear()

            for row in rows:
                buf.append((row.get("workspace", "default"), row["entity"], row["collection"],
                            row.get("type", ""), row.get("key"),
                            json.dumps(row.get("content", {})),
                            json.dumps(row.get("scores", {})),
                            row.get("enriched_at", "now()") if row.get("ready", True) else None))
                n += 1
                if len(buf) >= batch:
                    flush()
            if buf:
                flush()
        return n

    def load(self, rows: Iterable[dict[str, Any]], batch: int = 5000) -> int:
        """Write ``rows`` and relay them into the changes topic (then drop the slot):
        the topic holds exactly these change events.  Returns the count."""
        from wakeline.cdc.relay import Relay

        slot = f"load_{secrets.token_hex(4)}"
        relay = Relay(self.dsn, self.bootstrap, topic=self.topic("changes"), slot=slot,
                      partitions=self.partitions, tables=("records",), max_changes=20000)
        relay.start()
        try:
            n = self.insert(rows, batch)
            published = 0
            deadline = time.monotonic() + 600
            while published < n:
                b = relay.poll_once()
                published += sum(1 for _ in b.messages)
                if not b.messages and time.monotonic() > deadline:
                    raise RuntimeError(f"relay published {published} of {n}")
        finally:
            relay.close()
            relay.drop_slot()
        return n

    def end_offsets(self, topic: str) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-ends",
                      "log_level": 0})
        try:
            parts = c.list_topics(topic, timeout=30).topics[topic].partitions
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in parts}
        finally:
            c.close()

    def committed(self, group: str, topic: str) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group, "log_level": 0})
        try:
            tps = [TopicPartition(topic, p) for p in range(self.partitions)]
            return {tp.partition: tp.offset for tp in c.committed(tps, timeout=10)}
        finally:
            c.close()

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(sql, args).fetchall()

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        self.workers.clear()


class Services:
    """PostgreSQL + one broker for a benchmark run; stops what it started."""

    def __init__(self, broker: str = "kafka", *, pg_dsn: str | None = None,
                 bootstrap: str | None = None) -> None:
        self.broker = broker
        self._pg_dsn = pg_dsn
        self._bootstrap = bootstrap
        self.started: list[Any] = []
        self.stacks: list[Stack] = []

    def __enter__(self) -> Services:
        from wakeline.services import KafkaBroker, PostgresServer, TansuBroker

        if self._pg_dsn is None:
            root = Path(tempfile.mkdtemp(prefix="wl-bench-pg-"))
            root.chmod(0o755)  # the server runs as an unprivileged user when we are root
            pg = PostgresServer(base_dir=root, ephemeral=True)
            self.started.append(pg)
            pg.up(120)
            self._pg_dsn = pg.dsn
            self._pg = pg
        if self._bootstrap is None:
            base = Path(tempfile.mkdtemp(prefix=f"wl-bench-{self.broker}-"))
            b = (KafkaBroker(base_dir=base, ephemeral=True) if self.broker == "kafka"
                 else TansuBroker(base_dir=base, ephemeral=True))
            self.started.append(b)
            b.up(180)
            self._bootstrap = b.bootstrap
        return self

    def __exit__(self, *exc: object) -> None:
        for st in self.stacks:
            st.stop()
        for svc in reversed(self.started):
            svc.stop()

    @property
    def bootstrap(self) -> str:
        assert self._bootstrap is not None
        return self._bootstrap

    @property
    def pg_dsn(self) -> str:
        assert self._pg_dsn is not None
        return self._pg_dsn

    def stack(self, catalog: Path, *, partitions: int = 4, state_store: str = "memory",
              tmp: Path | None = None) -> Stack:
        from wakeline.services.postgres import dsn_with_database
        from wakeline.store import migrate

        name = f"b{secrets.token_hex(5)}"
        with psycopg.connect(self.pg_dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        dsn = dsn_with_database(self.pg_dsn, name)
        migrate(dsn)
        doc = {
            "name": name, "workspace": "default",
            "broker": {"kind": "external"}, "postgres": {"kind": "external"},
            "cdc": {"kind": "relay", "slot": f"s_{name}", "publication": "wakeline"},
            "topics": {k: {"name": f"{name}.{k}",
                           "partitions": partitions if k != "dead_letter" else 1}
                       for k in ("changes", "stimuli", "derive", "dead_letter")},
            "state_store": state_store,
        }
        folder = tmp or Path(tempfile.mkdtemp(prefix="wl-bench-topo-"))
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        st = Stack(dsn, self.bootstrap, name, path, catalog, partitions)
        st.ensure_topics()
        self.stacks.append(st)
        return st
