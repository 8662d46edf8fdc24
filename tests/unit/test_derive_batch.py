"""Derive batches without services: the waves a batch runs in, the loop
(streams/derive_agent.run_jobs) over a scripted executor (retries after backoff,
infrastructure failures retried and never dropped, a mailbox's jobs in order), and
the derive consumer's batches in flight and the offsets it commits."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from wakeline.derive import JobSpec, RunResult
from wakeline.derive.executor import waves
from wakeline.streams import derive_agent


def job(entity: str, n: int = 1, derivation: str = "d", attempt: int = 1) -> JobSpec:
    return JobSpec(f"default/{derivation}/{entity}/{n}", "default", derivation, entity,
                   ("manual",), attempt=attempt)


def test_waves_keep_one_job_per_mailbox_and_each_mailboxs_order() -> None:
    a1, a1_again, a2, b1, a3 = job("a"), job("a"), job("a", 2), job("b"), job("a", 3)
    assert waves([a1, b1]) == [[0, 1]]
    assert waves([a1, a1_again, b1, a2, a3]) == [[0, 2], [1], [3], [4]]
    assert waves([a1, job("a", derivation="e")]) == [[0, 1]]  # another mailbox
    assert waves([]) == []


@dataclass
class FakeExecutor:
    """Answers each job from ``script[(job_id, attempt)]``: a list of answers, one per
    call (an outcome string, or an Exception); ``raise_first`` fails the first call."""

    script: dict[tuple[str, int], list[Any]]
    raise_first: bool = False
    calls: list[list[tuple[str, int]]] = field(default_factory=list)
    resets: int = 0

    def execute_batch(self, jobs: list[JobSpec]) -> list[Any]:
        self.calls.append([(j.job_id, j.attempt) for j in jobs])
        if self.raise_first and len(self.calls) == 1:
            raise ConnectionError("server closed the connection")
        out: list[Any] = []
        for j in jobs:
            answer = self.script.get((j.job_id, j.attempt), ["succeeded"]).pop(0)
            if isinstance(answer, Exception):
                out.append(answer)
            elif answer == "failed":
                out.append(RunResult(j.job_id, j.attempt, "failed", retry_in=0.05))
            else:
                out.append(RunResult(j.job_id, j.attempt, answer))
        return out

    def reset(self) -> None:
        self.resets += 1


def run(jobs: list[JobSpec], ex: FakeExecutor) -> list[tuple[str, int, str, float]]:
    """The results reported (job id, attempt, outcome, monotonic time)."""
    reported: list[tuple[str, int, str, float]] = []
    derive_agent.run_jobs(ex, jobs, lambda r: reported.append(
        (r.job_id, r.attempt, r.outcome, time.monotonic())))
    return reported


@pytest.fixture(autouse=True)
def quick_infra_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(derive_agent, "infra_delay", lambda failures: 0.01)


def test_a_failed_job_is_retried_after_its_backoff_and_the_others_are_reported_first() -> None:
    a, b, c = job("a"), job("b"), job("c")
    ex = FakeExecutor({(b.job_id, 1): ["failed"]})
    reported = run([a, b, c], ex)
    assert [(r[0], r[1], r[2]) for r in reported] == [
        (a.job_id, 1, "succeeded"), (b.job_id, 1, "failed"), (c.job_id, 1, "succeeded"),
        (b.job_id, 2, "succeeded")]
    assert reported[3][3] - reported[1][3] >= 0.04  # after its backoff
    assert ex.calls == [[(a.job_id, 1), (b.job_id, 1), (c.job_id, 1)], [(b.job_id, 2)]]


def test_a_job_whose_write_failed_is_retried_alone_with_the_same_attempt() -> None:
    a, b = job("a"), job("b")
    ex = FakeExecutor({(b.job_id, 1): [RuntimeError("disk on fire"),
                                       RuntimeError("disk on fire"), "succeeded"]})
    reported = run([a, b], ex)
    assert [(r[0], r[1], r[2]) for r in reported] == [
        (a.job_id, 1, "succeeded"), (b.job_id, 1, "succeeded")]
    assert ex.calls == [[(a.job_id, 1), (b.job_id, 1)], [(b.job_id, 1)], [(b.job_id, 1)]]
    assert ex.resets == 0


def test_a_batch_that_failed_in_the_worker_reconnects_and_runs_again() -> None:
    a, b = job("a"), job("b")
    ex = FakeExecutor({}, raise_first=True)
    reported = run([a, b], ex)
    assert [(r[0], r[2]) for r in reported] == [(a.job_id, "succeeded"), (b.job_id, "succeeded")]
    assert ex.calls == [[(a.job_id, 1), (b.job_id, 1)]] * 2
    assert ex.resets == 1


def test_a_mailboxs_later_job_waits_for_the_earlier_ones_retries() -> None:
    a1, a2, b = job("a"), job("a", 2), job("b")
    ex = FakeExecutor({(a1.job_id, 1): ["failed"]})
    reported = run([a1, b, a2], ex)
    assert ex.calls == [[(a1.job_id, 1), (b.job_id, 1)], [(a1.job_id, 2)], [(a2.job_id, 1)]]
    assert [(r[0], r[1]) for r in reported] == [
        (a1.job_id, 1), (b.job_id, 1), (a1.job_id, 2), (a2.job_id, 1)]


class _Msg:
    """A confluent-kafka message of the derive topic."""

    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self._p, self._o, self._v = partition, offset, value

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def value(self) -> bytes:
        return self._v


class _Slow(FakeExecutor):
    """Runs each batch for ``seconds``, logging its start and end."""

    def __init__(self, log: list[tuple[str, Any]], seconds: float,
                 script: dict[tuple[str, int], list[Any]] | None = None) -> None:
        super().__init__(script or {})
        self.log, self.seconds = log, seconds

    def execute_batch(self, jobs: list[JobSpec]) -> list[Any]:
        self.log.append(("start", tuple(j.entity for j in jobs)))
        time.sleep(self.seconds)
        self.log.append(("end", tuple(j.entity for j in jobs)))
        return super().execute_batch(jobs)


class _Rig:
    """A DeriveConsumer's batching and offsets, fed messages by hand (no broker)."""

    def __init__(self, seconds: float = 0.2, script: dict[tuple[str, int], list[Any]] | None = None
                 ) -> None:
        self.log: list[tuple[str, Any]] = []
        self.stop = threading.Event()
        self.c = derive_agent.DeriveConsumer(
            lambda: _Slow(self.log, seconds, script), bootstrap="-", topic="t", group="g",
            dead_letter_topic="dlq", stop=self.stop, depth=2)
        for _ in range(2):
            self.c._executors.put(_Slow(self.log, seconds, script))
        self.c.assigned = {0, 1}
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.offset = {0: 0, 1: 0}

    def submit(self, *jobs: tuple[int, JobSpec]) -> None:
        msgs = []
        for p, j in jobs:
            msgs.append(_Msg(p, self.offset[p], j.to_json()))
            self.offset[p] += 1
        self.c._submit(self.pool, msgs)

    def positions(self) -> dict[int, int]:
        self.c._reap()
        return {tp.partition: tp.offset for tp in self.c._positions()}

    def close(self) -> None:
        self.stop.set()
        self.pool.shutdown()

    def __enter__(self) -> _Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_the_next_batch_runs_while_one_is_in_flight_and_offsets_wait_for_their_jobs() -> None:
    with _Rig(seconds=0.3) as rig:
        rig.submit((0, job("a")), (0, job("b")), (1, job("x")))
        rig.submit((0, job("c")), (1, job("y")))
        time.sleep(0.1)
        # the second batch started before the first ended; nothing has ended
        assert rig.log == [("start", ("a", "b", "x")), ("start", ("c", "y"))]
        assert rig.positions() == {0: 0, 1: 0}
        rig.c._drain()
        assert rig.positions() == {0: 3, 1: 2}


def test_a_partitions_offset_moves_to_the_first_job_of_a_batch_still_running() -> None:
    with _Rig(seconds=0.05) as rig:
        rig.submit((0, job("a")), (0, job("b")))
        time.sleep(0.2)  # ended
        for ex in rig.c._executors.queue:
            ex.seconds = 1.0  # the next batch takes its time
        rig.submit((0, job("c")))
        assert rig.positions() == {0: 2}  # not past c, which runs
        rig.c._drain()


def test_a_third_batch_waits_while_two_are_in_flight() -> None:
    with _Rig(seconds=0.2) as rig:
        rig.submit((0, job("a")))
        rig.submit((0, job("b")))
        rig.submit((0, job("c")))  # returns once a slot was free
        assert rig.log[:3] == [("start", ("a",)), ("start", ("b",)), ("end", ("a",))] or \
            rig.log[:3] == [("start", ("a",)), ("start", ("b",)), ("end", ("b",))]
        rig.c._drain()
        assert [e for e in rig.log if e[0] == "start"][-1] == ("start", ("c",))


def test_a_batch_sharing_a_mailbox_with_one_in_flight_waits_for_it() -> None:
    with _Rig(seconds=0.1) as rig:
        rig.submit((0, job("a")), (0, job("b")))
        rig.submit((1, job("a", 2)))
        rig.c._drain()
        assert rig.log == [("start", ("a", "b")), ("end", ("a", "b")),
                           ("start", ("a",)), ("end", ("a",))]


def test_a_job_left_waiting_for_its_retry_at_a_stop_holds_its_offset() -> None:
    a, b = job("a"), job("b")
    with _Rig(seconds=0.01, script={(b.job_id, 1): ["failed"]}) as rig:
        # b failed and may be retried in 50 ms; the worker stops before
        rig.stop.set()
        rig.submit((0, a), (0, b))
        rig.c._drain()
        assert rig.c.runs == 2  # a succeeded, b's first attempt failed
        assert rig.positions() == {0: 0}, "committed past a job that did not end"


def test_a_message_of_a_partition_no_longer_assigned_is_left_to_its_next_owner() -> None:
    with _Rig(seconds=0.01) as rig:
        rig.c.assigned = {1}
        rig.submit((0, job("a")), (1, job("b")))
        rig.c._drain()
        assert [e for e in rig.log if e[0] == "start"] == [("start", ("b",))]
        assert rig.positions() == {1: 1}


class _Commits:
    """The consumer's commit calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[int, int]], bool]] = []

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.calls.append(([(tp.partition, tp.offset) for tp in offsets], asynchronous))


def test_revoked_partitions_wait_for_their_jobs_and_commit_before_they_go() -> None:
    from confluent_kafka import TopicPartition

    with _Rig(seconds=0.3) as rig:
        commits = _Commits()
        rig.c._consumer = commits
        rig.submit((0, job("a")), (0, job("b")), (1, job("x")))
        rig.c._on_revoke(None, [TopicPartition("t", 0)])
        # every batch in flight ended first, then partition 0's offset went synchronously
        assert rig.log[-1][0] == "end"
        assert commits.calls == [([(0, 2)], False)]
        assert rig.c.assigned == {1} and 0 not in rig.c._next
        rig.c._commit()
        assert commits.calls[-1] == ([(1, 1)], True)
