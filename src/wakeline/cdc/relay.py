"""The built-in relay: pgoutput logical decoding → Debezium envelopes on Kafka.

The embedded default runs no JVM, so instead of Debezium a small loop reads the
replication slot through SQL (psycopg has no replication protocol)::

    pg_logical_slot_peek_binary_changes(slot, NULL, max_changes,
        'proto_version', '1', 'publication_names', pub, 'messages', 'true')

decodes the pgoutput messages (:mod:`wakeline.cdc.pgoutput`), writes the same
key and value Debezium would (:mod:`wakeline.cdc.compose`) and produces them
with confluent-kafka (idempotent, gapless, ``murmur2_random`` so each key lands
on the partition a Java producer picks).

Delivery contract (at least once, commit order per key):

- ``peek`` never consumes: the slot moves only through
  ``pg_replication_slot_advance`` and only after the broker acknowledged every
  message of the batch (``flush`` returned with no delivery error).  A crash or
  a broker error before that re-reads the same commits next time: duplicates,
  never loss.
- The slot advances to the end of the batch's last commit — a commit boundary,
  so a commit is never split — or to a non-transactional heartbeat message the
  relay writes itself when the slot idles behind WAL of unrelated tables.
- Messages are produced in decoding (= commit) order, so an entity's events sit
  on one partition in commit order; a replay after a failure repeats a prefix.

One relay per slot: PostgreSQL refuses a second reader of an active slot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer

from wakeline.cdc._kafka import ensure_topic, producer_config
from wakeline.cdc.compose import (
    ENGINE_TABLES,
    ColumnSpec,
    SourceTemplate,
    TableCodec,
    envelope,
)
from wakeline.cdc.errors import RelayError
from wakeline.cdc.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    Truncate,
    Update,
    decode,
)
from wakeline.cdc.snapshot import Progress, Snapshot

log = logging.getLogger(__name__)

DEFAULT_TOPIC: Final = "wakeline.changes"
DEFAULT_SLOT: Final = "wakeline"
DEFAULT_PUBLICATION: Final = "wakeline"
HEARTBEAT_PREFIX: Final = "wakeline.relay.heartbeat"


def format_lsn(lsn: int) -> str:
    """``0x16B3748`` → ``'0/16B3748'``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """``'0/16B3748'`` → ``0x16B3748``."""
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


@dataclass
class Batch:
    """What one peek decoded, ready to produce.

    ``messages`` are (key, value) in commit order; ``safe_lsn`` is where the slot
    may advance once all of them are acknowledged; ``full`` says the peek hit
    its row limit, so more is waiting.
    """

    messages: list[tuple[bytes, bytes]] = field(default_factory=list)
    commits: int = 0
    rows: int = 0
    full: bool = False
    safe_lsn: int | None = None
    last_commit_end: int | None = None
    #: commit time (Unix µs) of each commit in the batch, for latency figures
    commit_times_us: list[int] = field(default_factory=list)


@dataclass
class RelayStats:
    polls: int = 0
    commits: int = 0
    messages: int = 0
    skipped_truncates: int = 0
    skipped_tables: int = 0
    heartbeats: int = 0
    failures: int = 0
    confirmed_lsn: int = 0
    last_error: str | None = None


class Relay:
    """Streams the engine's tables from a replication slot to the change topic.

    :param dsn: PostgreSQL DSN (a role with REPLICATION or superuser).
    :param bootstrap: Kafka bootstrap servers (ignored when ``producer`` is given).
    :param topic: the change topic (the topology's ``topics.changes.name``).
    :param slot: the replication slot this relay owns (created when missing).
    :param publication: the publication to decode (``wakeline``, from migration 0002).
    :param server_name: ``source.name`` (Debezium's ``topic.prefix``).
    :param partitions: partitions when the relay creates the topic.
    :param snapshot: ``"initial"`` snapshots the tables when this relay creates
        its slot; ``"never"`` does not.
    :param tables: tables to relay (others in the publication are skipped).
    :param max_changes: rows per peek (whole commits are always returned).
    :param idle_sleep: seconds ``run_forever`` sleeps when there is nothing to do.
    :param flush_timeout: seconds to wait for the broker to acknowledge a batch.
    :param heartbeat_interval: when idle this long while the slot lags WAL of
        other tables by ``heartbeat_min_lag`` bytes, write a heartbeat message so
        the slot can advance and PostgreSQL can recycle WAL.
    :param restart_lag: when the slot's ``restart_lsn`` trails its confirmed
        position by more than this many bytes, log a running-transactions
        snapshot (``pg_log_standby_snapshot``, PostgreSQL 16+) so it can move:
        every peek decodes from ``restart_lsn``, so its lag is the cost of a poll.
    :param producer: a ready confluent-kafka producer (tests); else one is made
        from ``bootstrap`` and ``producer_config``.
    """

    def __init__(
        self,
        dsn: str,
        bootstrap: str | None = None,
        *,
        topic: str = DEFAULT_TOPIC,
        slot: str = DEFAULT_SLOT,
        publication: str = DEFAULT_PUBLICATION,
        server_name: str = "wakeline",
        partitions: int = 4,
        create_topic: bool = True,
        snapshot: str = "never",
        tables: Sequence[str] = ENGINE_TABLES,
        schema: str = "public",
        max_changes: int = 5000,
        idle_sleep: float = 0.02,
        flush_timeout: float = 30.0,
        heartbeat_interval: float = 10.0,
        heartbeat_min_lag: int = 64 * 1024,
        restart_lag: int = 1024 * 1024,
        producer: Producer | None = None,
        producer_config: Mapping[str, Any] | None = None,
    ) -> None:
        if snapshot not in ("never", "initial"):
            raise ValueError("snapshot must be 'never' or 'initial'")
        if producer is None and not bootstrap:
            raise ValueError("a bootstrap address or a producer is required")
        self.dsn = dsn
        self.bootstrap = bootstrap
        self.topic = topic
        self.slot = slot
        self.publication = publication
        self.server_name = server_name
        self.partitions = partitions
        self.create_topic = create_topic
        self.snapshot_mode = snapshot
        self.tables = frozenset(tables)
        self.table_order = tuple(tables)
        self.schema = schema
        self.max_changes = max_changes
        self.idle_sleep = idle_sleep
        self.flush_timeout = flush_timeout
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_min_lag = heartbeat_min_lag
        self.restart_lag = restart_lag
        self._restart_checked = 0.0
        self._can_log_snapshot = True
        self._producer_conf = dict(producer_config or {})
        self._producer = producer
        self._own_producer = producer is None
        self._conn: psycopg.Connection[Any] | None = None
        self._codecs: dict[int, TableCodec | None] = {}
        self._source: SourceTemplate | None = None
        self._prev_commit: int | None = None
        self._confirmed = 0
        self._idle_since = time.monotonic()
        self._delivery_errors: list[KafkaError] = []
        self._started = False
        self.stats = RelayStats()

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> Relay:
        """Connect, check the publication, create the slot and topic if missing.

        Idempotent.  With ``snapshot="initial"`` and a new slot, snapshots first.

        :raises RelayError: missing publication, slot owned by another plugin, …
        """
        if self._started:
            return self
        conn = self._connection()
        pub = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                           (self.publication,)).fetchone()
        if pub is None:
            raise RelayError(
                f"publication {self.publication!r} does not exist: apply the schema "
                "(`wakeline db migrate`), which creates it", publication=self.publication)
        created = self._ensure_slot(conn)
        if self.create_topic and self.bootstrap:
            ensure_topic(self.bootstrap, self.topic, self.partitions)
        self._producer_or_new()
        self._started = True
        if created and self.snapshot_mode == "initial":
            self.snapshot()
        return self

    def close(self) -> None:
        """Flush what is in flight (without advancing) and close connections."""
        if self._producer is not None and self._own_producer:
            self._producer.flush(min(self.flush_timeout, 5.0))
            self._producer = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._started = False

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Drop the connection and producer; the next poll starts over.

        Used after an error: the next :meth:`poll_once` reconnects, re-checks
        the slot, re-creates the topic if a memory-only broker lost it, and
        re-reads from the slot's confirmed position.
        """
        self._reset_connection()
        self._reset_producer()
        self._started = False

    def drop_slot(self) -> None:
        """Drop this relay's slot (tests, decommissioning).  The relay must be idle."""
        conn = self._connection()
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE slot_name = %s", (self.slot,))

    # -- the loop -------------------------------------------------------------

    def poll_once(self) -> Batch:
        """Read one batch, produce it, wait for the acknowledgements, advance the slot.

        Returns the batch (empty when there was nothing to do).

        :raises RelayError: the broker did not acknowledge; nothing was advanced.
        :raises psycopg.Error: the database went away; nothing was advanced.
        """
        self.start()
        self.stats.polls += 1
        batch = self.read_batch()
        if batch.messages:
            self.publish(batch)
        self.acknowledge(batch)
        if batch.commits or batch.messages:
            self._idle_since = time.monotonic()
            self._maybe_log_snapshot()
        else:
            self._maybe_heartbeat()
        return batch

    def run_forever(self, stop: threading.Event, *,
                    on_batch: Callable[[Batch], None] | None = None,
                    max_backoff: float = 5.0) -> None:
        """Poll until ``stop`` is set; sleep ``idle_sleep`` when idle.

        Database and broker errors are logged and retried with backoff (the slot
        has not moved, so nothing is lost); the connection is re-opened.
        """
        backoff = 0.1
        while not stop.is_set():
            try:
                batch = self.poll_once()
            except (psycopg.Error, RelayError, KafkaException) as exc:
                self.stats.failures += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("relay: %s; retrying in %.1fs", self.stats.last_error, backoff)
                self.reset()
                stop.wait(backoff)
                backoff = min(backoff * 2, max_backoff)
                continue
            backoff = 0.1
            if on_batch is not None and (batch.messages or batch.commits):
                on_batch(batch)
            if not batch.full and not batch.messages:
                stop.wait(self.idle_sleep)

    # -- the three steps of a poll (separate so tests can crash between them) --

    def read_batch(self) -> Batch:
        """Peek the slot and decode up to ``max_changes`` rows into envelopes."""
        conn = self._connection()
        with conn.cursor(binary=True) as cur:
            cur.execute(
                "SELECT (lsn - '0/0'::pg_lsn)::bigint, data FROM "
                "pg_logical_slot_peek_binary_changes(%s, NULL, %s, 'proto_version', '1', "
                "'publication_names', %s, 'messages', 'true')",
                (self.slot, self.max_changes, self.publication))
            rows = cur.fetchall()
        return self._decode(rows)

    def publish(self, batch: Batch) -> None:
        """Produce every message of ``batch`` and wait until the broker acknowledged all.

        :raises RelayError: a delivery failed or timed out (the producer is reset).
        """
        producer = self._producer_or_new()
        self._delivery_errors = []
        produce, poll, topic, cb = producer.produce, producer.poll, self.topic, self._delivered
        try:
            for i, (key, value) in enumerate(batch.messages):
                while True:
                    try:
                        produce(topic, value, key, on_delivery=cb)
                        break
                    except BufferError:
                        poll(0.05)
                if i & 1023 == 1023:
                    poll(0)
            remaining = producer.flush(self.flush_timeout)
        except KafkaException as exc:
            self._reset_producer()
            raise RelayError(f"producing to {self.topic!r} failed: {exc}",
                             topic=self.topic) from exc
        if remaining or self._delivery_errors:
            first = self._delivery_errors[0] if self._delivery_errors else None
            self._reset_producer()
            what = f"{remaining} message(s) unacknowledged after {self.flush_timeout:g}s" \
                if remaining else f"delivery failed: {first}"
            raise RelayError(f"{what}; the slot was not advanced and the batch will be "
                             "produced again", topic=self.topic)
        self.stats.messages += len(batch.messages)
        self.stats.commits += batch.commits

    def acknowledge(self, batch: Batch) -> None:
        """Advance the slot to ``batch.safe_lsn`` (a commit boundary or heartbeat)."""
        if batch.last_commit_end is not None:
            self._prev_commit = batch.last_commit_end
        target = batch.safe_lsn
        if target is None or target <= self._confirmed:
            return
        self._connection().execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                                   (self.slot, format_lsn(target)))
        self._confirmed = target
        self.stats.confirmed_lsn = target

    # -- snapshot -------------------------------------------------------------

    def snapshot(self, *, workspace: str | None = None, progress: Progress | None = None,
                 chunk: int = 2000) -> int:
        """Produce ``op: r`` events for the current rows; return how many.

        Does not touch the slot.  Safe while streaming: the events carry the
        snapshot's own LSN, and consumers rebuild from them (see
        :mod:`wakeline.cdc.snapshot`).

        :raises RelayError: the broker did not acknowledge every event.
        """
        if self.create_topic and self.bootstrap:
            ensure_topic(self.bootstrap, self.topic, self.partitions)
        producer = self._producer_or_new()
        self._delivery_errors = []
        snap = Snapshot(self.dsn, self._source_template(), schema=self.schema,
                        tables=self.table_order, workspace=workspace, chunk=chunk)
        done = 0
        for ev in snap:
            while True:
                try:
                    producer.produce(self.topic, ev.value, ev.key, on_delivery=self._delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            done += 1
            if progress is not None:
                progress(done, snap.info.total)
            if done & 1023 == 0:
                producer.poll(0)
        if progress is not None and done == 0:
            progress(0, 0)
        remaining = producer.flush(self.flush_timeout)
        if remaining or self._delivery_errors:
            self._reset_producer()
            raise RelayError(f"snapshot: {remaining or len(self._delivery_errors)} event(s) "
                             "not acknowledged; run the snapshot again", topic=self.topic)
        return done

    # -- internals ------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self.dsn, autocommit=True)
            # pgoutput formats values with this session's settings.
            conn.execute("SET TimeZone = 'UTC'")
            conn.execute("SET DateStyle = 'ISO'")
            conn.execute("SET IntervalStyle = 'postgres'")
            self._conn = conn
            self._codecs.clear()
            row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                               "WHERE slot_name = %s", (self.slot,)).fetchone()
            if row is not None and row[0]:
                self._confirmed = parse_lsn(row[0])
                if self._prev_commit is None:
                    self._prev_commit = self._confirmed
        return self._conn

    def _reset_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
        self._conn = None

    def _ensure_slot(self, conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute("SELECT plugin, slot_type, confirmed_flush_lsn::text "
                           "FROM pg_replication_slots WHERE slot_name = %s",
                           (self.slot,)).fetchone()
        if row is not None:
            plugin, kind, confirmed = row
            if kind != "logical" or plugin != "pgoutput":
                raise RelayError(f"replication slot {self.slot!r} exists with plugin "
                                 f"{plugin!r} ({kind}); the relay needs a pgoutput slot: "
                                 "drop it or choose another --slot", slot=self.slot)
            self._confirmed = parse_lsn(confirmed)
            if self._prev_commit is None:
                self._prev_commit = self._confirmed
            return False
        row = conn.execute("SELECT (lsn - '0/0'::pg_lsn)::bigint FROM "
                           "pg_create_logical_replication_slot(%s, 'pgoutput')",
                           (self.slot,)).fetchone()
        assert row is not None
        self._confirmed = int(row[0])
        self._prev_commit = self._confirmed
        log.info("relay: created slot %s at %s", self.slot, format_lsn(self._confirmed))
        return True

    def _source_template(self) -> SourceTemplate:
        if self._source is None:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                row = conn.execute("SELECT current_database()").fetchone()
            assert row is not None
            self._source = SourceTemplate(db=str(row[0]), name=self.server_name)
        return self._source

    def _producer_or_new(self) -> Producer:
        if self._producer is None:
            assert self.bootstrap is not None
            self._producer = Producer(producer_config(
                self.bootstrap, {"client.id": "wakeline-relay", **self._producer_conf}))
            self._own_producer = True
        return self._producer

    def _reset_producer(self) -> None:
        # A failed idempotent producer may hold a fatal error or a gap; start over.
        if self._own_producer and self._producer is not None:
            try:
                self._producer.purge()
                self._producer.flush(0)
            except KafkaException:
                pass
            self._producer = None

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._delivery_errors.append(err)

    def _codec(self, rel: Relation) -> TableCodec | None:
        if rel.name not in self.tables or rel.namespace != self.schema:
            return None
        cols = [ColumnSpec(c.name, c.type_oid, c.typmod, c.key) for c in rel.columns]
        return TableCodec(rel.namespace, rel.name, cols)

    def _decode(self, rows: list[tuple[int, bytes]]) -> Batch:
        batch = Batch(rows=len(rows), full=len(rows) >= self.max_changes)
        source = self._source_template()
        prev_commit = self._prev_commit
        begin: Begin | None = None
        out = batch.messages
        codecs = self._codecs
        for lsn, data in rows:
            msg = decode(bytes(data))
            if isinstance(msg, Begin):
                begin = msg
            elif isinstance(msg, (Insert, Update, Delete)):
                codec = codecs.get(msg.relation_oid, False)
                if codec is False:
                    raise RelayError(f"change for relation {msg.relation_oid} before its "
                                     "Relation message", slot=self.slot)
                if codec is None:
                    self.stats.skipped_tables += 1
                    continue
                if begin is None:
                    raise RelayError("change outside a transaction", slot=self.slot)
                assert isinstance(codec, TableCodec)
                self._emit(out, codec, msg, source, begin, lsn, prev_commit)
            elif isinstance(msg, Commit):
                batch.commits += 1
                batch.commit_times_us.append(msg.commit_time_us)
                prev_commit = msg.end_lsn
                batch.last_commit_end = msg.end_lsn
                batch.safe_lsn = msg.end_lsn
                begin = None
            elif isinstance(msg, Relation):
                codecs[msg.oid] = self._codec(msg)
            elif isinstance(msg, Message):
                if not msg.transactional:
                    # Everything before a non-transactional message was decoded.
                    batch.safe_lsn = max(batch.safe_lsn or 0, msg.lsn)
            elif isinstance(msg, Truncate):
                # Debezium's default skipped.operations=t: truncates are not relayed.
                self.stats.skipped_truncates += 1
        return batch

    def _emit(self, out: list[tuple[bytes, bytes]], codec: TableCodec,
              msg: Insert | Update | Delete, source: SourceTemplate, begin: Begin, lsn: int,
              prev_commit: int | None) -> None:
        src = source.block(schema=codec.schema, table=codec.table, ts_us=begin.commit_time_us,
                           tx_id=begin.xid, lsn=lsn, prev_commit_lsn=prev_commit, snapshot=None)
        if isinstance(msg, Insert):
            after = codec.row(msg.new)
            out.append((codec.key(after), envelope("c", None, after, src)))
        elif isinstance(msg, Update):
            before = codec.row(msg.old) if msg.old is not None else None
            after = codec.row(msg.new, msg.old)
            key = codec.key(after)
            old_key = codec.key(before) if before is not None else key
            if old_key != key:
                # A key change is a delete under the old key and a create under the
                # new one (Debezium does the same, so each partition stays whole).
                out.append((old_key, envelope("d", before, None, src)))
                out.append((key, envelope("c", None, after, src)))
            else:
                out.append((key, envelope("u", before, after, src)))
        else:
            before = codec.row(msg.old)
            out.append((codec.key(before), envelope("d", before, None, src)))

    def _maybe_log_snapshot(self) -> None:
        # PostgreSQL logs the running transactions every 15 s (bgwriter); only then
        # can restart_lsn move, so at 1k commits/s each peek would re-decode up to
        # 15 s of WAL.  Logging one ourselves keeps a peek proportional to its batch.
        now = time.monotonic()
        if not self._can_log_snapshot or now - self._restart_checked < 1.0:
            return
        self._restart_checked = now
        conn = self._connection()
        row = conn.execute("SELECT restart_lsn::text FROM pg_replication_slots "
                           "WHERE slot_name = %s", (self.slot,)).fetchone()
        if row is None or not row[0] or self._confirmed - parse_lsn(row[0]) < self.restart_lag:
            return
        try:
            conn.execute("SELECT pg_log_standby_snapshot()")
        except (psycopg.errors.UndefinedFunction, psycopg.errors.InsufficientPrivilege,
                psycopg.errors.ObjectNotInPrerequisiteState) as exc:
            log.info("relay: cannot log a running-transactions snapshot (%s); polls decode "
                     "from the slot's restart_lsn", exc)
            self._can_log_snapshot = False

    def _maybe_heartbeat(self) -> None:
        if time.monotonic() - self._idle_since < self.heartbeat_interval:
            return
        self._idle_since = time.monotonic()
        conn = self._connection()
        row = conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
        if row is None or int(row[0]) - self._confirmed < self.heartbeat_min_lag:
            return
        # Non-transactional: decoded immediately, and its LSN is a safe point.
        # Flushed (PostgreSQL 17+), else decoding would not see it until the WAL
        # writer flushes on its own.
        try:
            conn.execute("SELECT pg_logical_emit_message(false, %s, '', true)",
                         (HEARTBEAT_PREFIX,))
        except psycopg.errors.UndefinedFunction:
            conn.execute("SELECT pg_logical_emit_message(false, %s, '')", (HEARTBEAT_PREFIX,))
        self.stats.heartbeats += 1
