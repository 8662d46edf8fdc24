"""The time index: what a tick costs with many pending deadlines, and how late it fires.

``TimerIndex`` (``wakeline.streams.timers``) holds every entity's next deadline
(``Engine.next_wakeup``: a queued quiet/at/debounce job's ``run_after``); the
worker's ``ticks`` timer calls ``pop_due(now)`` every ``tick_interval`` (0.2 s)
and sends a tick to each key it returns, whose processing re-registers the
entity's next deadline with ``set``.  Figures, in one run:

1. *per tick, at fixed due counts*: with N pending deadlines (far in the future)
   and D of them due, the CPU time of one ``pop_due`` (and of the D re-registering
   ``set`` calls), for N in 10k/100k/1M: the cost must follow D, not N;
2. *set* cost per call and *memory* per pending entry (tracemalloc, keys not
   counted: they are the entity keys the worker holds anyway);
3. *churn and backlog*: deadlines moved many times (a debounce pushed by every
   record) must not grow the index, and keys in flight (ticked, not yet
   re-registered: a lagging stimuli topic) must not cost every tick;
4. *lateness*: a real tick loop (asyncio, fixed rate at 0.2 s, the system clock
   through ``wakeline.clock.SystemClock``, the clock the worker uses) over N
   pending, with deadlines spread over a few seconds — some from real engine
   states (quiet ``after_s``, write + ``debounce_s``, ``at`` a calendar field:
   ``next_wakeup`` relative to the record's arrival, placed after the loop's
   start), the rest synthetic; lateness = the clock's time when ``pop_due``
   returned the key minus its deadline.

Reference, in the same run: a bare ``heapq`` of the same ``(due, key)`` tuples,
pushing and popping the same deadlines tick by tick, interleaved with the
index; the last line is the ratio TimerIndex / heapq per due entry popped at the
largest N (default 1M).

    python bench/timers.py [--pending 1000000] [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import random
import statistics
import sys
import tempfile
import textwrap
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from wakeline.clock import Clock, SystemClock  # noqa: E402
from wakeline.streams.keys import entity_key  # noqa: E402
from wakeline.streams.timers import TimerIndex  # noqa: E402

PARTITIONS = 8
TICK = 0.2
FAR = 3600.0  # pending deadlines are spread over the next hour


def keys(n: int, prefix: str = "user") -> list[bytes]:
    return [entity_key("default", f"{prefix}:{i:07d}") for i in range(n)]


def fill(n: int, base: float, rnd: random.Random
         ) -> tuple[TimerIndex, list[bytes], list[float], float]:
    """An index with ``n`` deadlines in (base + 60, base + 60 + FAR); returns it, its
    keys, their deadlines and the seconds ``set`` took per call."""
    idx = TimerIndex()
    ks = keys(n)
    dues = [base + 60 + rnd.random() * FAR for _ in range(n)]
    t0 = time.perf_counter()
    for i, (k, due) in enumerate(zip(ks, dues, strict=True)):
        idx.set(i % PARTITIONS, k, due)
    return idx, ks, dues, (time.perf_counter() - t0) / n


def cpu(fn: Callable[[], object]) -> tuple[float, object]:
    c0 = time.process_time()
    out = fn()
    return time.process_time() - c0, out


def per_tick(n: int, due_counts: list[int], reps: int, base: float, rnd: random.Random
             ) -> tuple[dict[int, tuple[float, float, float]], float, float]:
    """With ``n`` pending: {D: (median CPU s of pop_due, of the D re-registering
    sets, of the reference's D heappops)}, and the s per set / heappush while
    filling.  The index and the reference see the same deadlines, tick by tick."""
    idx, ks, dues, set_s = fill(n, base, rnd)
    part = {k: i % PARTITIONS for i, k in enumerate(ks)}
    heap: list[tuple[float, bytes]] = []
    t0 = time.perf_counter()
    for k, due in zip(ks, dues, strict=True):
        heapq.heappush(heap, (due, k))
    push_s = (time.perf_counter() - t0) / n
    now = base
    out = {}
    gc.collect()
    for d in due_counts:
        pops, sets, refs = [], [], []
        for _ in range(reps):
            now += TICK
            chosen = [(ks[i], now - rnd.random() * TICK) for i in rnd.sample(range(n), d)]
            for k, due in chosen:  # D deadlines come due (not timed: the records' work)
                idx.set(part[k], k, due)
                heapq.heappush(heap, (due, k))
            c, popped = cpu(lambda now=now: idx.pop_due(now))
            assert isinstance(popped, list) and len(popped) == d, (len(popped), d)
            pops.append(c)
            c, _ = cpu(lambda now=now, popped=popped: [
                idx.set(part[k], k, now + 60 + FAR * rnd.random()) for k in popped])
            sets.append(c)

            def pop(now: float = now) -> list[bytes]:
                got = []
                while heap and heap[0][0] <= now:
                    got.append(heapq.heappop(heap)[1])
                return got

            c, popped = cpu(pop)
            assert isinstance(popped, list) and len(popped) == d
            refs.append(c)
        out[d] = (statistics.median(pops), statistics.median(sets), statistics.median(refs))
    return out, set_s, push_s


def memory(n: int, base: float) -> tuple[float, float]:
    """Bytes per pending entry: TimerIndex, and a bare heap of (due, key)."""
    rnd = random.Random(1)
    ks = keys(n)
    dues = [base + 60 + rnd.random() * FAR for _ in range(n)]
    gc.collect()
    tracemalloc.start()
    idx = TimerIndex()
    for i, (k, due) in enumerate(zip(ks, dues, strict=True)):
        idx.set(i % PARTITIONS, k, due)
    index_b = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del idx
    gc.collect()
    tracemalloc.start()
    heap: list[tuple[float, bytes]] = []
    for k, due in zip(ks, dues, strict=True):
        heapq.heappush(heap, (due, k))
    heap_b = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # The floats in `dues` exist before tracing in both cases; count them once each
    # (an index holds a float per entry that the caller does not keep).
    return index_b / n + 24, heap_b / n + 24


def churn(n: int, moves: int, base: float) -> tuple[int, int]:
    """Deadlines of n keys each moved ``moves`` times later (debounce): (pending,
    heap entries held)."""
    idx = TimerIndex()
    ks = keys(n)
    for m in range(moves):
        for i, k in enumerate(ks):
            idx.set(i % PARTITIONS, k, base + 60 + m + i * 1e-6)
    return len(idx), sum(len(h) for h in idx._heaps.values())


def backlog(n: int, inflight: int, reps: int, base: float) -> float:
    """CPU s of a pop_due with nothing due while ``inflight`` keys are ticked and not
    yet re-registered (their ticks still queued on a lagging stimuli topic)."""
    rnd = random.Random(3)
    idx, ks, _, _ = fill(n, base, rnd)
    now = base + 1
    for i in range(inflight):
        idx.set(i % PARTITIONS, ks[i], now - 0.1)
    assert len(idx.pop_due(now, limit=inflight)) == inflight
    samples = []
    for _ in range(reps):
        now += TICK
        c, popped = cpu(lambda now=now: idx.pop_due(now))
        assert popped == []
        samples.append(c)
    return statistics.median(samples)


# -- lateness: a real tick loop ---------------------------------------------------------

CATALOG = {
    "collections/main.yaml": """
        name: main
        keyed: false
        types: [chat]
    """,
    "collections/calendar.yaml": """
        name: calendar
        keyed: true
        fields:
          starts_at: datetime
    """,
    "derivations/settle.yaml": """
        name: settle
        function: funcs:noop
        source: {collections: [main]}
        trigger:
          quiet: {collections: [main], after_s: 2}
    """,
    "derivations/burst.yaml": """
        name: burst
        function: funcs:noop
        source: {collections: [main]}
        trigger:
          write: {}
          debounce_s: 1
    """,
    "derivations/remind.yaml": """
        name: remind
        function: funcs:noop
        source: {collections: [calendar]}
        trigger:
          at: {collections: [calendar], field: starts_at}
    """,
    "funcs.py": "def noop(ctx):\n    return []\n",
}


def engine_offsets(n: int, spread: float, rnd: random.Random) -> tuple[list[float], float]:
    """Deadlines from real engine states: ``n`` entities (a third each: quiet
    after_s=2, write with debounce_s=1, at = a calendar starts_at 2 s after the
    write), each with one record arriving at a random instant of the first
    ``spread`` - 2 seconds after an origin.  Returns each ``next_wakeup`` as seconds
    after the origin, and the seconds one ``next_wakeup`` call took."""
    from datetime import UTC, datetime

    from wakeline.catalog import compile_catalog
    from wakeline.core.build import build_plan
    from wakeline.core.engine import Engine
    from wakeline.core.events import RecordChanged
    from wakeline.core.plan import Rec
    from wakeline.core.state import EntityState

    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in CATALOG.items():
            path = Path(tmp) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        engine = Engine(build_plan(compile_catalog(Path(tmp))))
    origin = 1_780_000_000.0
    states = []
    for i in range(n):
        arrive = origin + rnd.random() * (spread - 2)
        st = EntityState("default", f"engine:{i:07d}")
        if i % 3 == 2:
            starts = datetime.fromtimestamp(arrive + 2, UTC).isoformat()
            rec = Rec(i + 1, "calendar", 1, "", "active", "standup",
                      {"starts_at": starts}, "", False, {}, {}, arrive, arrive)
        else:
            rec = Rec(i + 1, "main", 1, "chat", "active", None, {}, "", False, {}, {},
                      arrive, arrive)
        states.append(engine.apply(st, RecordChanged("c", rec, None, i + 1), arrive).state)
    t0 = time.perf_counter()
    dues = [engine.next_wakeup(st) for st in states]
    wake_s = (time.perf_counter() - t0) / n
    missing = sum(d is None for d in dues)
    if missing:
        raise SystemExit(f"{missing} engine states have no deadline: the catalog is wrong")
    return [d - origin for d in dues if d is not None], wake_s


async def tick_loop(idx: TimerIndex, clock: Clock, until: float, due_of: dict[bytes, float],
                    partition_of: dict[bytes, int]) -> tuple[list[float], list[float], int]:
    """The worker's ticks timer: every TICK (fixed rate), pop_due(clock.now()); each
    popped key's tick re-registers a far deadline (as the conditions agent does
    after processing it).  Returns (lateness per popped key, CPU s per tick, ticks)."""
    late: list[float] = []
    tick_cpu: list[float] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    k = 0
    while clock.now().timestamp() < until:
        k += 1
        await asyncio.sleep(max(0.0, start + k * TICK - loop.time()))
        c0 = time.process_time()
        popped = idx.pop_due(clock.now().timestamp())
        at = clock.now().timestamp()
        tick_cpu.append(time.process_time() - c0)
        late.extend(at - due_of[key] for key in popped)
        for key in popped:
            idx.set(partition_of[key], key, at + 60 + FAR)
    return late, tick_cpu, k


def lateness(n: int, engine_n: int, synthetic_due: int, spread: float, rnd: random.Random
             ) -> dict[str, float]:
    """The tick loop over ``n`` pending: ``engine_n`` deadlines from engine states
    and ``synthetic_due`` uniform ones due within ``spread`` s of the loop's start,
    the rest an hour out."""
    clock = SystemClock()
    offsets, wake_s = engine_offsets(engine_n, spread, rnd)
    offsets += [0.5 + rnd.random() * (spread - 0.5) for _ in range(synthetic_due)]
    soon = keys(len(offsets), "soon")
    idx = TimerIndex()
    partition_of: dict[bytes, int] = {}
    due_of: dict[bytes, float] = {}
    now = clock.now().timestamp()
    for i, k in enumerate(keys(n - len(soon))):
        partition_of[k] = i % PARTITIONS
        idx.set(i % PARTITIONS, k, now + 60 + rnd.random() * FAR)
    # The due deadlines are placed relative to the loop's start, after the fill.
    start = clock.now().timestamp() + 0.5
    for i, (k, off) in enumerate(zip(soon, offsets, strict=True)):
        partition_of[k] = i % PARTITIONS
        due_of[k] = start + off
        idx.set(i % PARTITIONS, k, start + off)
    if clock.now().timestamp() >= start + min(offsets):
        raise SystemExit("setting the due deadlines took longer than the margin")
    gc.collect()
    late, tick_cpu, ticks = asyncio.run(
        tick_loop(idx, clock, max(due_of.values()) + 2 * TICK, due_of, partition_of))
    if len(late) != len(soon):
        raise SystemExit(f"the tick loop popped {len(late)} keys, {len(soon)} were due")
    late.sort()
    q = statistics.quantiles(late, n=100, method="inclusive")
    return {"pending": len(idx), "due": len(soon), "engine": engine_n,
            "next_wakeup_us": wake_s * 1e6, "ticks": ticks,
            "p50": q[49], "p99": q[98], "max": late[-1], "min": late[0],
            "tick_cpu_p50_ms": statistics.median(tick_cpu) * 1e3,
            "tick_cpu_max_ms": max(tick_cpu) * 1e3,
            "rate": len(soon) / spread}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pending", type=int, default=1_000_000)
    ap.add_argument("--spread", type=float, default=5.0, help="seconds the due deadlines span")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    sizes = [10_000, 100_000, a.pending] if a.pending > 100_000 else [a.pending]
    dues = [0, 100, 1_000, 10_000]
    engine_n, synthetic = 15_000, 185_000
    if a.tiny:
        sizes, dues, a.reps, a.spread = [2_000, 20_000], [0, 10, 100], 2, 2.5
        engine_n, synthetic = 300, 1_000
    rnd = random.Random(7)
    base = time.time()

    print(f"per tick (median of {a.reps}, CPU ms): pop_due with D due / the D re-registering "
          "set() calls; reference: bare heapq pops")
    print(f"{'pending':>10} {'due':>7} {'pop_due':>9} {'per due us':>10} {'set x D':>8} "
          f"{'heapq':>8} {'ratio':>6}")
    top: tuple[float, float, float, float] | None = None
    for n in sizes:
        ticks, set_s, push_s = per_tick(n, dues, a.reps, base, rnd)
        for d in dues:
            pop_c, set_c, ref_c = ticks[d]
            per_due = f"{pop_c / d * 1e6:>10.2f}" if d else f"{'':>10}"
            ratio = f"{pop_c / ref_c:>6.2f}" if d and ref_c > 0 else f"{'':>6}"
            print(f"{n:>10,} {d:>7,} {pop_c * 1e3:>9.3f} {per_due} {set_c * 1e3:>8.3f} "
                  f"{ref_c * 1e3:>8.3f} {ratio}")
        print(f"{n:>10,} set() while filling: {set_s * 1e6:.2f} us/call "
              f"(heapq.heappush {push_s * 1e6:.2f} us)")
        d_top = dues[-1]
        top = (ticks[d_top][0] / d_top, ticks[d_top][2] / d_top, set_s, push_s)

    n = sizes[-1]
    idx_b, heap_b = memory(n, base)
    print(f"memory at {n:,} pending: {idx_b:,.0f} B/entry (bare heap {heap_b:,.0f} B/entry; "
          "keys not counted)")
    pending, held = churn(min(n, 100_000), 10, base)
    print(f"churn: {pending:,} keys, each deadline moved 10 times -> {held:,} heap entries held")
    inflight = min(n // 10, 100_000)
    bl = backlog(n, inflight, a.reps, base)
    print(f"backlog: {inflight:,} keys in flight (ticked, not re-registered), nothing due: "
          f"pop_due {bl * 1e3:.3f} ms CPU")

    for synthetic_due in (0, synthetic):
        lt = lateness(n, engine_n, synthetic_due, a.spread, rnd)
        print(f"lateness: tick loop every {TICK} s on SystemClock, {lt['pending']:,} pending, "
              f"{lt['due']:,} due over {a.spread:g} s ({lt['rate']:,.0f}/s; {lt['engine']:,} "
              f"from engine states, next_wakeup {lt['next_wakeup_us']:.1f} us/call), "
              f"{lt['ticks']} ticks")
        print(f"  late p50 {lt['p50'] * 1e3:.1f} ms, p99 {lt['p99'] * 1e3:.1f} ms, "
              f"max {lt['max'] * 1e3:.1f} ms, min {lt['min'] * 1e3:.1f} ms; "
              f"pop_due CPU per tick p50 {lt['tick_cpu_p50_ms']:.2f} ms, "
              f"max {lt['tick_cpu_max_ms']:.2f} ms")
    assert top is not None
    print(f"ratio TimerIndex/heapq at {n:,} pending: pop per due entry "
          f"{top[0] / top[1]:.2f} ({top[0] * 1e6:.2f} vs {top[1] * 1e6:.2f} us), set "
          f"{top[2] / top[3]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
