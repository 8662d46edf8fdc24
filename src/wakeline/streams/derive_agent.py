"""The derive role: jobs from the derive topic, run in batches.

:class:`DeriveConsumer` reads the derive topic with a librdkafka consumer in a
group of its own, ``<app id>-derive`` (as the readiness stage reads the change
topic), on a thread of its own.  It takes what arrived within
``WAKELINE_DERIVE_BATCH_WAIT`` seconds (5 ms) of the first job, up to
``WAKELINE_DERIVE_BATCH`` jobs (64), and hands them to :func:`run_jobs`, which
runs them with :meth:`DeriveExecutor.execute_batch` (one claim round trip and
one commit transaction for the batch, each job guarded on its own).

Why not a Faust agent: Faust hands an agent one event at a time (about 150 us of
CPU each here), and that per-event delivery, not PostgreSQL, bounded a derive
worker process at 2.0-2.2k jobs/s (bench/derive_worker.py, 2026-12-04); librdkafka
hands over a batch in one call.

Up to ``WAKELINE_DERIVE_PIPELINE`` batches (2) are in flight, each on an executor
(a PostgreSQL connection) of its own, while the next is read.  A batch sharing a
mailbox with one in flight waits for it: jobs of one mailbox never run side by
side.  Offsets are committed per partition up to the first job that has not
ended (succeeded, noop, dead, or answered duplicate), never past it.  When
partitions are taken away, the batches in flight finish and their offsets are
committed before the next owner starts.  A message that is not a job is
dead-lettered with its reason and the stream goes on.

A job that failed and may be retried (``retry_in``) runs again after its backoff
with the next attempt; the batch's other jobs are reported when they end, not
held back by it.  A failure of the database or of the worker (not of the
derivation) is retried with a growing delay and never dropped: a whole batch
that failed reconnects the executor first, a job whose own write failed is
retried alone.  Jobs of one mailbox in a batch (a redelivery) run one after the
other, each with its retries, in their order.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from wakeline.derive import JobSpec, RunResult
from wakeline.derive.executor import waves
from wakeline.streams.gcpolicy import collect_between_batches

log = logging.getLogger("wakeline.streams.derive")


def batch_max() -> int:
    """Most jobs the consumer runs as one batch."""
    return max(1, int(os.environ.get("WAKELINE_DERIVE_BATCH", "64")))


def batch_wait() -> float:
    """Longest a job waits for its batch to fill (seconds)."""
    return float(os.environ.get("WAKELINE_DERIVE_BATCH_WAIT", "0.005"))


def pipeline_depth() -> int:
    """Most batches in flight at once (and executors, one connection each)."""
    return max(1, int(os.environ.get("WAKELINE_DERIVE_PIPELINE", "2")))


def infra_delay(failures: int) -> float:
    """Delay before retrying after the ``failures``-th infrastructure failure."""
    return min(30.0, 0.5 * 2 ** failures)


def _no_trace(*parts: Any) -> None:
    return None


class Stopped(Exception):
    """The worker is stopping: a job waiting for a retry is left to the next owner."""


def run_jobs(ex: Any, jobs: list[JobSpec], report: Callable[[RunResult], None], *,
             sleep: Callable[[float], None] = time.sleep,
             now: Callable[[], float] = time.monotonic) -> None:
    """Run ``jobs`` to their end on ``ex``: each is reported once per attempt that
    ran, retried while it may be, and none is dropped.  ``sleep`` waits out a
    backoff (it raises :class:`Stopped` when the worker stops meanwhile)."""
    for wave in waves(jobs):
        _run_wave(ex, [jobs[i] for i in wave], report, sleep, now)


def _run_wave(ex: Any, jobs: list[JobSpec], report: Callable[[RunResult], None],
              sleep: Callable[[float], None], now: Callable[[], float]) -> None:
    # (when it is due, its place in the batch, the job); infra failures per job id
    pending: list[tuple[float, int, JobSpec]] = [(0.0, k, job) for k, job in enumerate(jobs)]
    infra: dict[str, int] = {}
    while pending:
        t = now()
        due = [p for p in pending if p[0] <= t]
        if not due:
            sleep(min(p[0] for p in pending) - t)
            continue
        pending = [p for p in pending if p[0] > t]
        due.sort(key=lambda p: p[1])
        try:
            answers = ex.execute_batch([job for _, _, job in due])
        except Exception:
            # The database or the worker failed, not a derivation: the batch is
            # retried (never dropped) on a new connection; no cursor row was touched
            # by a job that did not commit.
            log.exception("a batch of %d jobs failed in the worker", len(due))
            with contextlib.suppress(Exception):
                ex.reset()
            for _, k, job in due:
                infra[job.job_id] = n = infra.get(job.job_id, 0) + 1
                pending.append((now() + infra_delay(n), k, job))
            continue
        for (_, k, job), answer in zip(due, answers, strict=True):
            if isinstance(answer, Exception):
                # This job's own write failed (and applied nothing); the others
                # committed.  Retried alone, with the same attempt.
                infra[job.job_id] = n = infra.get(job.job_id, 0) + 1
                log.error("job %s attempt %d failed in the worker: %r", job.job_id,
                          job.attempt, answer)
                pending.append((now() + infra_delay(n), k, job))
                continue
            report(answer)
            if answer.outcome == "failed" and answer.retry_in is not None:
                pending.append((now() + answer.retry_in, k,
                                replace(job, attempt=job.attempt + 1)))


@dataclass
class _Batch:
    done: Future[None]
    boxes: set[tuple[str, str, str]]
    first: dict[int, int]  # per partition, the batch's lowest offset


class DeriveConsumer(threading.Thread):
    """The derive role's consumer (see the module docstring).

    :param make_executor: a new :class:`DeriveExecutor` (one per batch in flight).
    :param on_run: every run result, from an executor thread.
    :param on_outcome: the ``dead_letter`` outcome of a message that is not a job.
    """

    def __init__(self, make_executor: Callable[[], Any], *, bootstrap: str, topic: str,
                 group: str, dead_letter_topic: str, stop: threading.Event,
                 on_run: Callable[[RunResult], None] | None = None,
                 on_outcome: Callable[[Any], None] | None = None,
                 announce: bool = False, trace: Callable[..., None] = _no_trace,
                 batch: int | None = None, wait: float | None = None,
                 depth: int | None = None) -> None:
        super().__init__(name="derive", daemon=True)
        self.make_executor = make_executor
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.dead_letter_topic = dead_letter_topic
        self.stop_event, self.on_run, self.on_outcome = stop, on_run, on_outcome
        self.announce, self.trace = announce, trace
        self.batch = batch or batch_max()
        self.wait = batch_wait() if wait is None else wait
        self.depth = depth or pipeline_depth()
        self.consumed = 0
        self.batches = 0
        self.runs = 0
        self.dead_letters = 0
        self.failures = 0
        self.assigned: set[int] = set()
        self._lock = threading.Lock()
        self._executors: queue.Queue[Any] = queue.Queue()
        self._made: list[Any] = []
        self._inflight: collections.deque[_Batch] = collections.deque()
        self._next: dict[int, int] = {}  # per partition, the offset after the last read
        self._committed: dict[int, int] = {}
        self._hold: dict[int, int] = {}  # per partition, the first job that did not end
        self._consumer: Any = None
        self._dlq: Any = None

    # -- results ------------------------------------------------------------------------

    def _report(self, result: RunResult) -> None:
        with self._lock:
            self.runs += 1
        self.trace("result", result.job_id, result.outcome)
        if self.on_run is not None:
            self.on_run(result)

    def _sleep(self, seconds: float) -> None:
        if self.stop_event.wait(max(0.0, seconds)):
            raise Stopped

    def _run(self, jobs: list[JobSpec]) -> None:
        ex = self._executors.get()
        try:
            run_jobs(ex, jobs, self._report, sleep=self._sleep)
        finally:
            self._executors.put(ex)

    # -- offsets ------------------------------------------------------------------------

    def _positions(self, partitions: set[int] | None = None) -> list[Any]:
        """Per partition read, the offset to commit: the first job not ended."""
        from confluent_kafka import TopicPartition

        out = []
        for p, nxt in self._next.items():
            if partitions is not None and p not in partitions:
                continue
            pos = min([nxt, self._hold.get(p, nxt),
                       *(b.first[p] for b in self._inflight if p in b.first)])
            if self._committed.get(p) != pos:
                out.append(TopicPartition(self.topic, p, pos))
        return out

    def _commit(self, partitions: set[int] | None = None, *, sync: bool = False) -> None:
        tps = self._positions(partitions)
        if not tps:
            return
        try:
            self._consumer.commit(offsets=tps, asynchronous=not sync)
        except Exception as exc:  # noqa: BLE001 - nothing to commit yet, or a rebalance
            log.warning("derive: offsets not committed: %s", exc)
            return
        for tp in tps:
            self._committed[tp.partition] = tp.offset

    def _reap(self, *, until: Callable[[], bool] | None = None) -> None:
        """Forget the batches that ended, oldest first; with ``until``, wait for the
        oldest ones until it holds.  A batch that did not end holds its partitions'
        offsets where it began, and one that raised (not :class:`Stopped`) raises here."""
        while self._inflight:
            head = self._inflight[0]
            if not head.done.done():
                if until is None or until():
                    return
                wait([head.done])
            self._inflight.popleft()
            exc = head.done.exception()
            if exc is not None:
                for p, o in head.first.items():
                    self._hold[p] = min(self._hold.get(p, o), o)
                if not isinstance(exc, Stopped):
                    raise exc

    def _drain(self) -> None:
        """Wait for every batch in flight; the first failure raises after all ended."""
        wait([b.done for b in self._inflight])
        errors: list[Exception] = []
        while self._inflight:
            try:
                self._reap(until=lambda: False)
            except Exception as exc:  # noqa: BLE001 - raised below, after the rest
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- rebalance ----------------------------------------------------------------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned |= {p.partition for p in partitions}
        if self.announce:
            print(f"wakeline: derive ready, partitions {sorted(self.assigned)}", flush=True)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        gone = {p.partition for p in partitions}
        try:
            self._drain()  # the jobs read from them end here, before the next owner
        finally:
            self._commit(gone, sync=True)
            self.assigned -= gone
            for p in gone:
                for d in (self._next, self._committed, self._hold):
                    d.pop(p, None)

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> None:
        backoff = 0.5
        try:
            while not self.stop_event.is_set():
                try:
                    while len(self._made) < self.depth:  # PostgreSQL may not be up yet
                        ex = self.make_executor()
                        self._made.append(ex)
                        self._executors.put(ex)
                    self._session()
                    return
                except Exception:  # noqa: BLE001 - an outage or a bug: start again
                    self.failures += 1
                    log.exception("derive: restarting from the committed offsets in %.1f s",
                                  backoff)
                    self.stop_event.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
        finally:
            for ex in self._made:
                with contextlib.suppress(Exception):
                    ex.close()

    def _session(self) -> None:
        from confluent_kafka import Consumer

        consumer = self._consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": self.group,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "log_level": 3,
            "fetch.wait.max.ms": 20, "client.id": "wakeline-derive",
        })
        pool = ThreadPoolExecutor(max_workers=self.depth, thread_name_prefix="derive")
        for d in (self._next, self._committed, self._hold):
            d.clear()
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        try:
            while not self.stop_event.is_set():
                self._reap()
                self._commit()
                first = consumer.poll(0.1)
                if first is None:
                    continue
                msgs = [first, *consumer.consume(self.batch - 1, self.wait)]
                self.consumed += len(msgs)
                self._submit(pool, msgs)
        finally:
            try:
                self._drain()
            finally:
                self._commit(sync=True)
                pool.shutdown(wait=False, cancel_futures=True)
                self.assigned.clear()
                consumer.close()
                if self._dlq is not None:
                    self._dlq.producer.flush(10)

    def _submit(self, pool: ThreadPoolExecutor, msgs: list[Any]) -> None:
        """Start the jobs of ``msgs`` as one batch, once it may run."""
        jobs: list[JobSpec] = []
        first: dict[int, int] = {}
        dead: dict[int, int] = {}  # per partition, the first dead letter
        for m in msgs:
            if m.error() is not None:
                log.warning("derive: %s", m.error())
                continue
            p, o = m.partition(), m.offset()
            if p not in self.assigned:
                continue  # read before a revocation; its next owner reads it
            self._next[p] = o + 1
            try:
                job = JobSpec.from_json(m.value())
            except Exception as exc:  # noqa: BLE001 - not a job: dead-lettered
                self._dead_letter(m, exc)
                dead.setdefault(p, o)
                continue
            self.trace("derive-recv", job.job_id, p, o)
            first.setdefault(p, o)
            jobs.append(job)
        if dead:
            try:
                self._dlq.flush()  # before an offset past a dead letter is committed
            except Exception:
                for p, o in dead.items():
                    self._hold[p] = min(self._hold.get(p, o), o)
                raise
        if not jobs:
            return
        boxes = {job.mailbox for job in jobs}
        self._reap(until=lambda: len(self._inflight) < self.depth
                   and not any(boxes & b.boxes for b in self._inflight))
        self._inflight.append(_Batch(pool.submit(self._run, jobs), boxes, first))
        self.batches += 1
        collect_between_batches("derive")

    def _dead_letter(self, msg: Any, exc: Exception) -> None:
        from confluent_kafka import Producer

        from wakeline.cdc._kafka import producer_config
        from wakeline.cdc.dlq import DeadLetterWriter
        from wakeline.core.outcomes import Outcome, OutcomeKind
        from wakeline.streams.keys import parse_key

        if self._dlq is None:
            self._dlq = DeadLetterWriter(topic=self.dead_letter_topic, producer=Producer(
                producer_config(self.bootstrap, {"linger.ms": 0,
                                                 "client.id": "wakeline-derive"})))
        reason = f"not a derive job: {type(exc).__name__}: {exc}"
        self._dlq.write(code="derive.job.malformed", reason=reason, key=msg.key(),
                        value=msg.value(), topic=msg.topic() or "",
                        partition=msg.partition(), offset=msg.offset())
        self.dead_letters += 1
        if self.on_outcome is not None:
            ident = parse_key(msg.key()) or ("", "")
            self.on_outcome(Outcome(
                OutcomeKind.DEAD_LETTER, f"derive.job.malformed: {reason}", datetime.now(UTC),
                ident[0], ident[1], None, None,
                {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset()}))
