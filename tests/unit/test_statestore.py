"""The entity store's frame and its bookkeeping without a broker (streams/statestore.py);
its reloads from a real changelog are covered end to end (tests/integration)."""

from __future__ import annotations

import asyncio

from wakeline.core.codec import encode_state
from wakeline.core.state import EntityState
from wakeline.streams import statestore
from wakeline.streams.statestore import EntityStore, frame, unframe


def test_the_frame_carries_wakeup_and_running_ahead_of_the_state() -> None:
    body = encode_state(EntityState("w", "e"))
    assert unframe(frame(body, 1_780_000_000.5, True)) == (body, 1_780_000_000.5, True)
    assert unframe(frame(body, None, False)) == (body, None, False)
    assert unframe(frame(body, 0.0, False)) == (body, 0.0, False)  # 0 is a time, not "none"
    # an older worker's bare codec value: the frame's fields are unknown
    assert unframe(body) == (body, None, None)
    assert body[:1] != b"\xf1" and b'{"'[:1] != b"\xf1"


def _store(reads: dict, monkeypatch) -> EntityStore:
    """A store whose changelog reads come from ``reads[(partition, start)]``."""
    store = EntityStore(bootstrap="-", topic="t", group="g",
                        meta=lambda st: (None, False), live_max=2)
    store.reads = []  # type: ignore[attr-defined]

    def read(bootstrap, topic, partition, group, start=None):
        store.reads.append((partition, start))  # type: ignore[attr-defined]
        data, end = reads[(partition, start)]
        return dict(data), len(data), 0.0, end
    monkeypatch.setattr(statestore, "read_partition", read)
    return store


def test_reload_then_writes_then_a_kept_partition_reads_on_from_its_end(monkeypatch) -> None:
    a, b = "w\x1fa", "w\x1fb"
    st_a = EntityState("w", "a")
    st_a.last_lsn = 5
    old = {a: frame(encode_state(st_a), 100.0, True), b: encode_state(EntityState("w", "b"))}
    store = _store({(0, None): (old, 2), (0, 3): ({b: frame(b"\x01\x00", 50.0, True)}, 4)},
                   monkeypatch)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        store.keep_only({0})
        r = await store.loading(0, loop)
        assert (r.entities, r.wakeups, r.running) == (2, [(a, 100.0)], [a])
        assert store.loading(0, loop) is None  # loaded
        got = store.get(0, a, "w", "a")
        assert got.last_lsn == 5
        got.last_lsn = 9
        store.put(0, a, got, 7.0, True)
        sent = []
        assert store.flush(lambda *m: sent.append(m)) == 1
        assert sent[0][:3] == ("t", b'"w\\u001fa"', 0)
        assert unframe(store.parts[0][a])[1:] == (7.0, True)
        store.written(0, 2)  # the broker took it at offset 2
        # a rebalance keeps partition 0: read on from offset 3, what others wrote wins
        assert store.keep_only({0}) == set()
        r = await store.loading(0, loop)
        assert store.reads == [(0, None), (0, 3)]
        assert store.parts[0][b] == frame(b"\x01\x00", 50.0, True)
        # only what was read on needs a timer or a resync: `a`, kept, has its timer
        # and its run in flight is this worker's own
        assert (r.entities, r.wakeups, r.running) == (2, [(b, 50.0)], [b])
        assert store.get(0, a, "w", "a").last_lsn == 9
        assert store.end[0] == 4
        # revoked: forgotten, and a write still pending for it is not sent
        store.put(0, a, got, None, False)
        assert store.keep_only({1}) == {0}
        assert store.flush(lambda *m: sent.append(m)) == 0 and 0 not in store.parts

    asyncio.run(run())


def test_live_states_are_bounded() -> None:
    store = EntityStore(bootstrap="-", topic="t", group="g", meta=lambda st: (None, False),
                        live_max=2)
    store.parts[0] = {}
    for i in range(5):
        store.put(0, f"w\x1f{i}", EntityState("w", str(i)), None, False)
    store.flush(lambda *m: None)
    assert len(store._live) == 2 and len(store.parts[0]) == 5
    assert store.get(0, "w\x1f0", "w", "0") == EntityState("w", "0")  # decoded from bytes


def test_the_least_recently_used_live_state_goes_first() -> None:
    store = EntityStore(bootstrap="-", topic="t", group="g", meta=lambda st: (None, False),
                        live_max=2)
    store.parts[0] = {}
    states = {i: EntityState("w", str(i)) for i in range(3)}
    for i in (0, 1):
        store.put(0, f"w\x1f{i}", states[i], None, False)
    store.flush(lambda *m: None)
    assert store.get(0, "w\x1f0", "w", "0") is states[0]  # 0 is now the most recent
    store.put(0, "w\x1f2", states[2], None, False)
    store.flush(lambda *m: None)
    assert list(store._live) == ["w\x1f0", "w\x1f2"]  # 1 was evicted, not 0
    assert store.get(0, "w\x1f0", "w", "0") is states[0]
    assert store.get(0, "w\x1f1", "w", "1") is not states[1]  # decoded again from bytes


def test_states_waiting_for_the_flush_are_bounded_and_written_in_order() -> None:
    """Between flushes at most ``2 * dirty_max`` states are held decoded for it: the
    oldest are encoded early, and the flush still writes every change, a state
    changed again after it was encoded twice, the newer value last."""
    store = EntityStore(bootstrap="-", topic="t", group="g", meta=lambda st: (None, False),
                        live_max=2, dirty_max=2)
    store.parts[0] = {}
    held = []
    for i in range(7):
        st = EntityState("w", str(i))
        st.last_lsn = i
        store.put(0, f"w\x1f{i}", st, None, False)
        held.append(len(store._dirty))
        assert len(store._live) <= 2
    assert held == [1, 2, 3, 4, 3, 4, 3]  # past 2 * dirty_max, the oldest 2 are encoded
    assert set(store.parts[0]) == {"w\x1f0", "w\x1f1", "w\x1f2", "w\x1f3"}  # stored already
    # entity 0 changes again: decoded from its stored bytes, and written twice
    again = store.get(0, "w\x1f0", "w", "0")
    assert again.last_lsn == 0 and again is not None
    again.last_lsn = 10
    store.put(0, "w\x1f0", again, 5.0, True)
    sent: list[tuple] = []
    assert store.flush(lambda *m: sent.append(m)) == 8
    keys = [m[1] for m in sent]
    assert sorted(set(keys)) == sorted(f'"w\\u001f{i}"'.encode() for i in range(7))
    assert keys.index(b'"w\\u001f0"') < len(keys) - 1 and keys[-1] == b'"w\\u001f0"'
    last = {m[1]: m[3] for m in sent}  # what a compacted changelog keeps
    assert unframe(last[b'"w\\u001f0"'])[1:] == (5.0, True)
    assert store.get(0, "w\x1f0", "w", "0").last_lsn == 10
    assert [store.get(0, f"w\x1f{i}", "w", str(i)).last_lsn for i in range(1, 7)] == \
        list(range(1, 7))
    assert store.flush(lambda *m: sent.append(m)) == 0  # nothing waits any more


def test_a_state_changed_then_evicted_before_the_flush_is_read_as_changed() -> None:
    """A state put, then pushed out of the live states by others before the flush
    encoded it, is read back as put: not from its older stored bytes."""
    store = EntityStore(bootstrap="-", topic="t", group="g", meta=lambda st: (None, False),
                        live_max=2, dirty_max=2)
    store.parts[0] = {}
    for i in range(3):
        st = EntityState("w", str(i))
        st.last_lsn = 10 + i
        store.put(0, f"w\x1f{i}", st, None, False)
    assert "w\x1f0" not in store._live and "w\x1f0" not in store.parts[0]
    assert store.get(0, "w\x1f0", "w", "0").last_lsn == 10


def test_reads_see_every_write_whatever_the_live_and_waiting_bounds() -> None:
    """Random gets, puts and flushes over a few entities, with bounds small enough that
    states move between live, waiting and stored all the time: each read returns what
    was last put for that entity, and the changelog's last value per key is that too."""
    import random

    from wakeline.core.codec import decode_state

    rnd = random.Random(11)
    for live_max, dirty_max in ((1, 1), (2, 1), (2, 3), (3, 2), (8, 8)):
        store = EntityStore(bootstrap="-", topic="t", group="g",
                            meta=lambda st: (None, False), live_max=live_max,
                            dirty_max=dirty_max)
        store.parts[0] = {}
        model: dict[str, int] = {}
        changelog: dict[bytes, bytes] = {}

        def write(topic: str, key: bytes, p: int, value: bytes,
                  log: dict[bytes, bytes] = changelog) -> None:
            log[key] = value  # what a compacted changelog keeps: the last value
        for step in range(3000):
            e = str(rnd.randrange(12))
            skey = f"w\x1f{e}"
            op = rnd.random()
            if op < 0.55:
                st = store.get(0, skey, "w", e)
                assert st.last_lsn == model.get(skey, 0), (live_max, dirty_max, step)
                st.last_lsn = step + 1
                store.put(0, skey, st, None, False)
                model[skey] = step + 1
            elif op < 0.9:
                assert store.get(0, skey, "w", e).last_lsn == model.get(skey, 0)
            else:
                store.flush(write)
        store.flush(write)
        for skey, lsn in model.items():
            key = f'"w\\u001f{skey[2:]}"'.encode()
            assert decode_state(unframe(changelog[key])[0], "w", skey[2:]).last_lsn == lsn
