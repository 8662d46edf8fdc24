"""The conditions agent's delivery (streams/delivery.py): a batch's jobs are
acknowledged before its states are produced; its states are acknowledged before the
next batch flushes and before any offset commit, but not before the next batch is
taken; a refused state stops every commit after it.

The producer here is a stand-in whose ``flush`` blocks until the test lets the
broker "answer", so each ordering can be observed; the real producer and broker
run in the integration and recovery tests."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from wakeline.streams.delivery import Delivery, StatesRefused, hold_commits


class GatedProducer:
    """Records produce/flush calls; a flush with a state (a message for an explicit
    partition) queued returns once ``answer`` is set, one with jobs only at once;
    each calls the queued delivery callbacks (an error for partition ``refuse``)."""

    def __init__(self, refuse: int | None = None) -> None:
        self.log: list[tuple[str, Any]] = []
        self.queued: list[tuple[Any, str, int | None]] = []
        self.answer = threading.Event()
        self.answer.set()
        self.refuse = refuse
        self.offset = 0

    def produce(self, topic: str, value: bytes, key: bytes, partition: int | None = None,
                on_delivery: Any = None) -> None:
        self.log.append(("produce", (topic, key)))
        self.queued.append((on_delivery, topic, partition))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        self.log.append(("flush", len(self.queued)))
        if any(partition is not None for _, _, partition in self.queued):
            assert self.answer.wait(10)
        queued, self.queued = self.queued, []
        for cb, _topic, partition in queued:
            self.offset += 1
            err = "refused" if partition is not None and partition == self.refuse else None
            cb(err, Msg(partition or 0, self.offset))
        self.log.append(("flushed", len(queued)))
        return 0


class Msg:
    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


def states_of(*keys: str, partition: int = 0) -> Any:
    def flush(produce: Any) -> int:
        for k in keys:
            produce("states", k.encode(), partition, b"v")
        return len(keys)
    return flush


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_deliver_returns_before_the_states_are_acknowledged_and_settled_waits_for_them():
    producer = GatedProducer()
    producer.answer.clear()  # the broker holds its answer to the states
    written: list[tuple[int, int]] = []

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            d = Delivery(lambda: producer, pool)
            n = await asyncio.wait_for(
                d.deliver([(b"e1", b"job1")], "derive", states_of("s1", "s2"),
                          lambda p, o: written.append((p, o))), 5)
            assert n == 2
            # The jobs were flushed (acknowledged) before any state was produced.
            assert producer.log[:3] == [("produce", ("derive", b"e1")), ("flush", 1),
                                        ("flushed", 1)]
            settled = asyncio.ensure_future(d.settled())
            await asyncio.sleep(0.05)
            assert not settled.done() and written == []
            producer.answer.set()
            await asyncio.wait_for(settled, 5)
            assert [w[0] for w in written] == [0, 0]
            assert producer.queued == []

    run(main())


def test_the_next_batch_flushes_its_jobs_only_after_the_previous_states():
    producer = GatedProducer()
    producer.answer.clear()

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            d = Delivery(lambda: producer, pool)
            first = asyncio.ensure_future(
                d.deliver([], "derive", states_of("s1"), lambda p, o: None))
            await asyncio.sleep(0.05)
            assert first.done()  # no jobs to wait for; the states are in flight
            second = asyncio.ensure_future(
                d.deliver([(b"e2", b"job2")], "derive", states_of("s2"), lambda p, o: None))
            await asyncio.sleep(0.05)
            assert not second.done()
            # The second batch's job is produced, but its flush waits for the first
            # batch's states: one flush at a time.
            assert [e for e in producer.log if e[0] == "flush"] == [("flush", 1)]
            assert ("produce", ("derive", b"e2")) in producer.log
            producer.answer.set()
            assert await asyncio.wait_for(second, 5) == 1
            await d.settled()
            kinds = [e[0] for e in producer.log]
            # flush(states 1), then flush(job 2), then states 2 produced and flushed
            assert kinds.count("flush") == 3
            assert producer.log.index(("produce", ("states", b"s2"))) > \
                [i for i, e in enumerate(producer.log) if e[0] == "flushed"][1]

    run(main())


def test_refused_states_raise_from_settled_every_time_after():
    producer = GatedProducer(refuse=3)

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            d = Delivery(lambda: producer, pool)
            await d.deliver([], "derive", states_of("s1", partition=3), lambda p, o: None)
            with pytest.raises(StatesRefused, match="did not take 1 of 1 state"):
                await d.settled()
            with pytest.raises(StatesRefused):
                await d.settled()
            with pytest.raises(StatesRefused):  # the next batch does not go on
                await d.deliver([(b"e", b"j")], "derive", states_of("s2"), lambda p, o: None)

    run(main())


class FaustConsumer:
    """Faust's ``_commit_tps``: reads the acked offsets on entry."""

    def __init__(self, acked: dict[str, int]) -> None:
        self.acked = acked
        self.commits: list[dict[str, int]] = []

    async def _commit_tps(self, tps: Any, start_new_transaction: bool) -> bool:
        self.commits.append(dict(self.acked))
        await asyncio.sleep(0)
        return True


def test_commits_wait_for_the_states_in_flight_and_stop_after_a_refusal():
    producer = GatedProducer(refuse=7)
    producer.answer.clear()

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            d = Delivery(lambda: producer, pool)
            consumer = FaustConsumer({"ready-0": 0})
            hold_commits(consumer, d)
            hold_commits(consumer, d)  # idempotent: one wrapper
            await d.deliver([], "derive", states_of("s1"), lambda p, o: None)
            consumer.acked["ready-0"] = 10  # the batch was acked after deliver returned
            commit = asyncio.ensure_future(consumer._commit_tps(["ready-0"], True))
            await asyncio.sleep(0.05)
            assert not commit.done() and consumer.commits == []
            producer.answer.set()
            assert await asyncio.wait_for(commit, 5) is True
            assert consumer.commits == [{"ready-0": 10}]
            # A refused state: the commit raises and commits nothing.
            await d.deliver([], "derive", states_of("s2", partition=7), lambda p, o: None)
            consumer.acked["ready-0"] = 20
            with pytest.raises(StatesRefused):
                await consumer._commit_tps(["ready-0"], True)
            assert consumer.commits == [{"ready-0": 10}]

    run(main())


def test_faust_commits_through_the_method_hold_commits_wraps():
    """hold_commits relies on Faust's consumer reading the acked offsets in
    ``_commit_tps``, called by ``force_commit``: a Faust version that commits another
    way would leave the states unguarded, so this fails first."""
    import inspect

    from faust.transport.consumer import Consumer

    assert inspect.iscoroutinefunction(Consumer._commit_tps)
    assert "self._commit_tps(" in inspect.getsource(Consumer.force_commit)
    body = inspect.getsource(Consumer._commit_tps)
    assert body.index("_filter_committable_offsets") < body.index("await")
