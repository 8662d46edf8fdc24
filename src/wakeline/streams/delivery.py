"""The conditions agent's writes to the broker: a batch's jobs, then its states.

Both go through one librdkafka producer (:attr:`Runtime.producer`).  The order is
what keeps a crash harmless: a batch's jobs are acknowledged by the broker before
its states are produced, so a crash between the two leaves states that never saw
their jobs, and the replayed events dispatch them again (a duplicate run finds
nothing new); the other order could leave a state waiting for a job that was never
sent.

A batch's states need not be acknowledged before the *next* batch is taken, only
before the offsets of the batch that made them are committed.  So
:meth:`Delivery.deliver` returns once the jobs are acknowledged and the states are
handed to the producer; the broker's round trip for the states overlaps the next
batch's take, decode and evaluation (at 5k commits/s that round trip was one of the
two the agent waited for per batch).  :func:`hold_commits` makes Faust's offset
commit wait for the states in flight, and a state the broker refused stops the
commit and the agent: the batch's events come again from the last commit.

One flush at a time: each :meth:`Delivery.deliver` first waits for the previous
batch's states (librdkafka's flush waits for everything queued anyway).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class StatesRefused(RuntimeError):
    """The broker did not take a batch's states: its events must not be committed."""


class Delivery:
    """Jobs and states of the conditions agent's batches (one per worker process).

    :param producer: returns the librdkafka producer (created on first use).
    :param executor: where the blocking ``flush`` calls run.
    """

    def __init__(self, producer: Callable[[], Any], executor: Any) -> None:
        self._producer = producer
        self._executor = executor
        #: the flush of the last batch's states, while the broker has not answered
        self._states: asyncio.Future[None] | None = None
        #: why the broker refused a batch's states (sticky: nothing is committed after)
        self.error: str | None = None

    async def settled(self) -> None:
        """Once every state produced so far was acknowledged; raises
        :class:`StatesRefused` if one was not (then and every time after)."""
        while (pending := self._states) is not None:
            await pending
            if self._states is pending:
                self._states = None
        if self.error is not None:
            raise StatesRefused(self.error)

    async def deliver(self, jobs: list[tuple[bytes, bytes]], derive_topic: str,
                      states: Callable[[Callable[[str, bytes, int, bytes], None]], int],
                      written: Callable[[int, int], None]) -> int:
        """Produce ``jobs`` (key, value) to ``derive_topic`` and wait until the broker
        took them; then hand the batch's states to the producer
        (``states(produce)``: the entity store's flush, returning how many) without
        waiting for them.  ``written(partition, offset)`` is called for each state
        the broker acknowledges.  Returns how many states were produced."""
        loop = asyncio.get_running_loop()
        producer = self._producer()
        failed: list[Any] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(err)

        for key, value in jobs:
            produce(producer, derive_topic, value, key, None, delivered)
        await self.settled()  # the previous batch's states; one flush at a time
        if jobs:
            left = await loop.run_in_executor(self._executor, producer.flush, 60.0)
            if left or failed:
                raise RuntimeError(f"the broker did not take {left} job(s)"
                                   + (f": {failed[0]}" if failed else "")
                                   + "; the batch is not acked and comes again")

        refused: list[Any] = []

        def state_delivered(err: Any, msg: Any) -> None:
            if err is not None:
                refused.append(err)
            else:
                written(msg.partition(), msg.offset())

        def produce_state(topic: str, key: bytes, partition: int, value: bytes) -> None:
            produce(producer, topic, value, key, partition, state_delivered)

        n = states(produce_state)
        if n:
            self._states = asyncio.ensure_future(self._settle(
                loop.run_in_executor(self._executor, producer.flush, 60.0), n, refused))
        return n

    async def _settle(self, flushed: asyncio.Future[int], n: int, refused: list[Any]) -> None:
        try:
            left = await flushed
        except Exception as exc:  # noqa: BLE001 - recorded, raised by settled()
            self.error = f"flushing {n} state(s) failed: {exc!r}"
            return
        if left or refused:
            self.error = (f"the broker did not take {left or len(refused)} of {n} state(s)"
                          + (f": {refused[0]}" if refused else "")
                          + "; the batch's offsets are not committed and its events come"
                            " again")


def hold_commits(consumer: Any, delivery: Delivery) -> None:
    """Make Faust's offset commits (the periodic one, and the one before a
    rebalance or a stop) wait until the states of every acked batch are
    acknowledged by the broker (idempotent).

    Faust's ``force_commit`` calls ``_commit_tps``, which reads the acked offsets
    synchronously on entry: after :meth:`Delivery.settled` returns, every batch
    acked so far had its states flushed (a batch is acked only after its
    ``deliver`` started that flush)."""
    if getattr(consumer, "_wakeline_holds", None) is delivery:
        return
    commit_tps = consumer._commit_tps

    async def _commit_tps(tps: Any, start_new_transaction: bool) -> bool:
        await delivery.settled()
        return bool(await commit_tps(tps, start_new_transaction))

    consumer._commit_tps = _commit_tps
    consumer._wakeline_holds = delivery


def produce(producer: Any, topic: str, value: bytes, key: bytes | None,
            partition: int | None, on_delivery: Any) -> None:
    """``producer.produce``, waiting for room while librdkafka's queue is full."""
    while True:
        try:
            if partition is None:
                producer.produce(topic, value, key, on_delivery=on_delivery)
            else:
                producer.produce(topic, value, key, partition=partition,
                                 on_delivery=on_delivery)
            return
        except BufferError:  # the local queue is full: let it drain
            producer.poll(0.05)
