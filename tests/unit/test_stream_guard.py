"""The offset guard: each partition's events in order, none skipped (streams/guard.py)."""

from __future__ import annotations

from wakeline.streams import guard as g
from wakeline.streams.guard import OffsetGuard


def test_first_event_must_be_the_committed_offset() -> None:
    og = OffsetGuard("t")
    assert og.admit("p0", 10, committed=7) == ("seek", 7)
    assert og.admit("p0", 11, committed=7) == ("dup", None)  # the old fetch's buffer
    assert og.admit("p0", 7, committed=7) == ("ok", None)
    assert og.admit("p0", 8, committed=7) == ("ok", None)
    assert og.seeks == 1


def test_without_a_known_first_offset_the_partition_beginning_is_due() -> None:
    # The bug this pins: the first offset that happened to arrive was taken as the
    # baseline, so what Faust dropped before it was skipped and committed past.
    og = OffsetGuard("t")
    assert og.admit("p0", 3, committed=None) == ("seek", 0)
    assert og.admit("p0", 0, committed=None) == ("ok", None)
    assert og.admit("p1", 0, committed=-1001) == ("ok", None)


def test_a_jump_seeks_back_and_duplicates_are_skipped() -> None:
    og = OffsetGuard("t")
    for off in range(5):
        assert og.admit("p0", off, committed=0) == ("ok", None)
    assert og.admit("p0", 9, committed=0) == ("seek", 5)
    assert og.admit("p0", 10, committed=0) == ("dup", None)
    assert og.admit("p0", 3, committed=0) == ("dup", None)
    assert [og.admit("p0", off, committed=0)[0] for off in range(5, 11)] == ["ok"] * 6
    assert (og.duplicates, og.ahead, og.seeks) == (1, 1, 1)


def test_a_seek_is_repeated_when_the_missing_offset_never_comes(monkeypatch) -> None:
    og = OffsetGuard("t")
    og.admit("p0", 0, committed=0)
    now = [100.0]
    monkeypatch.setattr(g.time, "monotonic", lambda: now[0])
    assert og.admit("p0", 5, committed=0) == ("seek", 1)
    now[0] += g.RESEEK_AFTER / 2
    assert og.admit("p0", 6, committed=0) == ("dup", None)
    now[0] += g.RESEEK_AFTER
    assert og.admit("p0", 7, committed=0) == ("seek", 1)
    assert og.seeks == 2


def test_forgotten_partitions_start_again_at_the_commit() -> None:
    og = OffsetGuard("t")
    og.admit("p0", 0, committed=0)
    og.admit("p0", 1, committed=0)
    og.forget(["p0"])
    assert og.admit("p0", 0, committed=0) == ("ok", None)  # our own replay, not a dup


class _Thread:
    """The part of Faust's consumer thread that :func:`first_due` uses."""

    def __init__(self, broker_commits: dict, fail: bool = False) -> None:
        self.broker_commits, self.fail, self.asked = broker_commits, fail, 0

    def _ensure_consumer(self):
        return self

    async def committed(self, tp):
        self.asked += 1
        if self.fail:
            raise RuntimeError("coordinator moved")
        return self.broker_commits.get((tp.topic, tp.partition))

    async def call_thread(self, fn, *args):
        return await fn(*args)


class _App:
    def __init__(self, faust_commits: dict, broker_commits: dict, earliest: dict,
                 fail: bool = False) -> None:
        class Consumer:
            pass
        self.consumer = Consumer()
        self.consumer._committed_offset = faust_commits
        self.consumer._thread = _Thread(broker_commits, fail)

        async def earliest_offsets(*tps):
            return {tp: earliest[tp] for tp in tps}
        self.consumer.earliest_offsets = earliest_offsets


def _tp(p: int):
    from faust.types import TP
    return TP("changes", p)


def test_first_due_asks_faust_then_the_broker_then_our_last_then_the_beginning() -> None:
    import asyncio

    og = OffsetGuard("t")
    og.stale[_tp(2)] = 40
    app = _App({_tp(0): 7}, {("changes", 1): 12}, {_tp(2): 0, _tp(3): 5})

    async def run():
        return [await g.first_due(app, og, _tp(p)) for p in range(4)]
    assert asyncio.run(run()) == [7, 12, 40, 5]
    assert app.consumer._thread.asked == 3          # Faust knew p0
    asyncio.run(g.first_due(app, og, _tp(3)))
    assert app.consumer._thread.asked == 3          # kept until revoked
    og.forget([_tp(3)])
    asyncio.run(g.first_due(app, og, _tp(3)))
    assert app.consumer._thread.asked == 4


def test_first_due_falls_back_to_the_beginning_when_the_broker_cannot_answer() -> None:
    import asyncio

    og = OffsetGuard("t")
    app = _App({}, {}, {}, fail=True)
    assert asyncio.run(g.first_due(app, og, _tp(0))) == 0


def test_a_partition_owned_again_resumes_after_our_last_offset_when_no_commit_is_known() -> None:
    import asyncio

    og = OffsetGuard("t")
    for off in range(100):
        og.admit("p3", off, committed=0)
    og.forget(["p3"])
    assert og.stale["p3"] == 100
    # offset 100 was fetched and dropped in the rebalance; nobody committed
    app = _App({}, {}, {_tp(3): 0})
    og.stale[_tp(3)] = og.stale.pop("p3")
    due = asyncio.run(g.first_due(app, og, _tp(3)))
    assert og.admit(_tp(3), 101, committed=due) == ("seek", 100)
    assert og.admit(_tp(3), 100, committed=due) == ("ok", None)
    og.forget([_tp(3)])
    assert og.admit(_tp(3), 250, committed=250) == ("ok", None)  # the commit wins


def test_seeks_run_on_the_consumer_thread_not_the_callers() -> None:
    """Faust's Consumer.seek mutates aiokafka's fetch buffer from the caller's thread
    while the consumer thread iterates it (a KeyError crash); ours goes through
    call_thread, so the seek runs on the consumer's own thread."""
    import asyncio
    import concurrent.futures
    import threading

    class Thread:
        def __init__(self) -> None:
            self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="consumer")
            self.seeks: list[tuple[object, int, str]] = []

        def seek(self, tp, offset) -> None:
            self.seeks.append((tp, offset, threading.current_thread().name))

        async def call_thread(self, fn, *args):  # mode's: sync or async functions
            async def call():
                out = fn(*args)
                return await out if asyncio.iscoroutine(out) else out
            return await asyncio.wrap_future(self.pool.submit(lambda: asyncio.run(call())))

    class Consumer:
        def __init__(self) -> None:
            self._thread = Thread()
            self._read_offset: dict = {}

        async def seek(self, tp, offset) -> None:  # Faust's: on the caller's thread
            self._thread.seek(tp, offset)

    class App:
        consumer = Consumer()

    app = App()
    og = OffsetGuard("t")
    og.admit(_tp(0), 5, committed=5)
    ev = type("Ev", (), {"message": type("M", (), {"tp": _tp(0), "offset": 9})()})()
    assert asyncio.run(g.admit_batch(app, og, [ev])) == []
    [(tp, offset, name)] = app.consumer._thread.seeks
    assert (tp, offset) == (_tp(0), 6) and name.startswith("consumer")
    assert app.consumer._read_offset[_tp(0)] == 6
