"""Derive batches without services: the waves a batch runs in, and the agent's loop
(streams/derive_agent.run_jobs) over a scripted executor: retries after backoff,
infrastructure failures retried and never dropped, a mailbox's jobs in order."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
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
    """The results reported (job id, attempt, outcome, loop time)."""
    reported: list[tuple[str, int, str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        queue.put_nowait(ex)

        async def executor() -> Any:
            return await queue.get()

        rt = SimpleNamespace(
            executor=executor, _executors=queue, counters=SimpleNamespace(runs=0),
            _pool=ThreadPoolExecutor(max_workers=1),
            on_run=lambda r: reported.append((r.job_id, r.attempt, r.outcome, loop.time())))
        await derive_agent.run_jobs(rt, jobs)
        assert rt.counters.runs == len(reported)
        assert queue.qsize() == 1  # the executor went back
        rt._pool.shutdown()

    asyncio.run(main())
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
    """Faust's Message reference counting: final when the count reaches 0."""

    def __init__(self, offset: int) -> None:
        self.offset, self.partition, self.refcount, self.acked = offset, 0, 1, False

    def incref(self) -> None:
        self.refcount += 1

    def ack(self) -> bool:
        self.refcount -= 1
        if self.refcount == 0:
            self.acked = True
            return True
        return False


class _Stream:
    """``take_events`` as Faust runs it: nothing is delivered while the loop body runs,
    and each event is acked once the body returns."""

    def __init__(self, batches: list[list[JobSpec]], log: list[tuple[str, Any]]) -> None:
        self.events = [[SimpleNamespace(value=j.to_json(), message=_Msg(k * 100 + i))
                        for i, j in enumerate(b)] for k, b in enumerate(batches)]
        self.log = log

    async def take_events(self, n: int, within: float) -> Any:
        for batch in self.events:
            self.log.append(("delivered", [e.message.offset for e in batch]))
            yield batch
            for e in batch:
                await self.ack(e)

    async def ack(self, event: Any) -> bool:
        if event.message.ack():
            self.log.append(("committable", event.message.offset))
            return True
        return False


class _SlowExecutor(FakeExecutor):
    def __init__(self, log: list[tuple[str, Any]], seconds: float) -> None:
        super().__init__({})
        self.log, self.seconds = log, seconds

    def execute_batch(self, jobs: list[JobSpec]) -> list[Any]:
        import time

        self.log.append(("start", [j.entity for j in jobs]))
        time.sleep(self.seconds)
        self.log.append(("end", [j.entity for j in jobs]))
        return super().execute_batch(jobs)


def consume(batches: list[list[JobSpec]]) -> list[tuple[str, Any]]:
    log: list[tuple[str, Any]] = []

    async def main() -> None:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        for _ in range(2):
            queue.put_nowait(_SlowExecutor(log, 0.05))

        async def executor() -> Any:
            return await queue.get()

        rt = SimpleNamespace(executor=executor, _executors=queue,
                             counters=SimpleNamespace(runs=0),
                             _pool=ThreadPoolExecutor(max_workers=2), on_run=None)

        async def admit_all(app: Any, guard: Any, events: list[Any]) -> list[Any]:
            return events

        import wakeline.streams.guard as guard_mod
        real = guard_mod.admit_batch
        guard_mod.admit_batch = admit_all
        try:
            await derive_agent.consume(None, rt, _Stream(batches, log), None)
        finally:
            guard_mod.admit_batch = real
            rt._pool.shutdown()

    asyncio.run(main())
    return log


def test_the_next_batch_is_delivered_while_one_runs_and_offsets_wait_for_their_jobs() -> None:
    log = consume([[job("a"), job("b")], [job("c")]])
    at = {entry: i for i, entry in enumerate((k, tuple(v) if isinstance(v, list) else v)
                                              for k, v in log)}
    # the second batch was delivered and started before the first ended
    assert at[("delivered", (100,))] < at[("end", ("a", "b"))]
    assert at[("start", ("c",))] < at[("end", ("a", "b"))]
    # an offset becomes committable only after its job's batch ended
    assert at[("committable", 0)] > at[("end", ("a", "b"))]
    assert at[("committable", 1)] > at[("end", ("a", "b"))]
    assert at[("committable", 100)] > at[("end", ("c",))]


def test_a_batch_sharing_a_mailbox_with_one_in_flight_waits_for_it() -> None:
    log = consume([[job("a"), job("b")], [job("a", 2)]])
    order = [(k, tuple(v)) for k, v in log if k in ("start", "end")]
    assert order == [("start", ("a", "b")), ("end", ("a", "b")),
                     ("start", ("a",)), ("end", ("a",))]
