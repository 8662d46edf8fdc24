"""``send_resyncs`` sends again what the broker refused, and gives up loudly.

The producer here is a stand-in whose flush answers each queued message with the
error the test chose; the real producer and broker run in
tests/integration/test_resync.py (every resync on its entity's partition) and in
``bench/recovery.py --tiny`` (a kill -9 with runs in flight)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from wakeline.streams import stimuli
from wakeline.streams.app import send_resyncs


class Msg:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def key(self) -> bytes:
        return self._key


class RefusingProducer:
    """Refuses the keys in ``refuse[n]`` at the n-th flush; records what it took."""

    def __init__(self, refuse: list[set[bytes]]) -> None:
        self.refuse = refuse
        self.flushes = 0
        self.queued: list[tuple[bytes, bytes, Any]] = []
        self.taken: list[bytes] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any = None) -> None:
        assert stimuli.decode(value).__class__ is stimuli.Resync
        self.queued.append((key, value, on_delivery))

    def flush(self, timeout: float = 0) -> int:
        bad = self.refuse[self.flushes] if self.flushes < len(self.refuse) else set()
        self.flushes += 1
        queued, self.queued = self.queued, []
        for key, _value, cb in queued:
            if key in bad:
                cb("refused", Msg(key))
            else:
                self.taken.append(key)
                cb(None, Msg(key))
        return 0


def _send(producer: RefusingProducer, keys: list[bytes], attempts: int = 5) -> None:
    async def main() -> None:
        with ThreadPoolExecutor(1) as io:
            await send_resyncs(SimpleNamespace(producer=producer, _io=io), "stimuli", keys,
                               attempts=attempts, pause=0.001)
    asyncio.run(main())


def test_refused_resyncs_are_sent_again_until_the_broker_takes_them() -> None:
    keys = [b"a", b"b", b"c"]
    producer = RefusingProducer([{b"b", b"c"}, {b"c"}])
    _send(producer, keys)
    assert producer.flushes == 3
    assert producer.taken == [b"a", b"b", b"c"]  # each taken once, the refused ones later


def test_resyncs_the_broker_keeps_refusing_raise_after_the_attempts() -> None:
    producer = RefusingProducer([{b"b"}] * 3)
    with pytest.raises(RuntimeError, match="did not take 1 of 2 resync stimuli after 3 attempts"):
        _send(producer, [b"a", b"b"], attempts=3)
    assert producer.flushes == 3 and producer.taken == [b"a"]


def test_a_failed_reload_task_is_logged_when_it_ends(caplog) -> None:
    from wakeline.streams.app import _report_failure

    async def fail() -> None:
        raise RuntimeError("the broker did not take 1 of 2 resync stimuli")

    async def main() -> None:
        task = asyncio.ensure_future(fail())
        task.add_done_callback(_report_failure)
        await asyncio.sleep(0.01)

    with caplog.at_level("ERROR", logger="wakeline.streams"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == [
        "after the state reload: the broker did not take 1 of 2 resync stimuli"]
