"""The cyclic garbage collector in a worker process: when it runs, and what it costs.

The hot paths allocate many containers (decoded ready batches, events, entity states,
outcomes) that reference counting frees, but a conditions batch keeps tens of
thousands of them alive until it is handled: at CPython's default threshold (700
allocations) the collector ran every few hundred changes and rescanned them each time,
and still at 50,000 (`bench/stream_throughput.py`, Tansu and Kafka, 100k entities) the
collector took 18.6-23.1 % of the worker's CPU: 95-106 young collections of ~20 ms
each in the middle of batches, and 8-9 of the next generation at ~200 ms.

So the collector runs between batches instead, when a batch's objects are gone:
:func:`collect_between_batches` after each batch collects the young generation once
50,000 more containers are alive than at the last collection (and the next generation
every tenth time), and the automatic threshold is raised to 1,000,000, a net for code
that never reaches a batch boundary.  Objects alive at start-up are frozen (never
scanned again).  What forms reference cycles is still collected.

One batch loop per process collects (:func:`tune_gc`'s ``roles``): the conditions
agent's when the process runs it, else the readiness stage's, else the derive
consumer's.  The readiness stage runs in a thread beside the agent: when its batch
boundaries collected too, every young collection of a one-process worker came from
the readiness thread in the middle of an agent batch, and scanned that batch's live
states and outcomes (a census of the young generation at each collection, 2026-12-07:
40k-127k objects, DState, Outcome, EntityState, Fact among the readiness stage's own).

Compiled, the core's states and per-record objects are outside the collector
altogether (``@cython.no_gc``, core/state.pxd).  What a young collection of the
conditions process scans since is mostly the tuples and lists of the batch being
decoded (a census, 2026-12-07: 20-26k objects, 16-18 ms); over a 200k-record run the
collector took 0.03-0.25 s of its CPU (0.5-3.7 %), against 0.18-0.56 s (2.6-7.6 %)
for the build before, alternating in the same session.
"""

from __future__ import annotations

import gc
import time

#: the automatic young-generation threshold in workers (CPython's default: 700)
GC_THRESHOLD0 = 1_000_000
#: allocations since the last collection after which a batch boundary collects
GC_BETWEEN_BATCHES = 50_000

#: collections and seconds spent in them since start-up, per generation, and the longest
#: (the stats line's ``gc``)
GC_SPENT: dict[str, list[float]] = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0],
                                    "longest": [0.0, 0.0, 0.0]}
_started = [0.0]
#: the roles whose batch loops may collect, first first; the one that runs here collects
_COLLECTORS = ("conditions", "readiness", "derive")
#: the role whose batch boundaries collect in this process (None: every caller's)
_collector: list[str | None] = [None]


def _timer(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    g = info["generation"]
    took = time.perf_counter() - _started[0]
    GC_SPENT["collections"][g] += 1
    GC_SPENT["seconds"][g] += took
    if took > GC_SPENT["longest"][g]:
        GC_SPENT["longest"][g] = took


def tune_gc(roles: tuple[str, ...] | list[str] | set[str] = ()) -> None:
    """Freeze what start-up allocated, raise the automatic threshold to
    :data:`GC_THRESHOLD0`, time every collection (:data:`GC_SPENT`), and let the batch
    loop of the first of :data:`_COLLECTORS` among ``roles`` collect."""
    _collector[0] = next((r for r in _COLLECTORS if r in roles), None)
    gc.collect()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, g1, g2)
    if _timer not in gc.callbacks:
        gc.callbacks.append(_timer)


def collect_between_batches(role: str = "conditions") -> None:
    """At a batch boundary of ``role``'s loop, when it is the process's collector:
    collect the young generation once :data:`GC_BETWEEN_BATCHES` more containers are
    alive than at the last collection, the next one too when it was collected ten
    times since (CPython's own ratio)."""
    if _collector[0] is not None and role != _collector[0]:
        return
    young, middle, _ = gc.get_count()
    if young >= GC_BETWEEN_BATCHES:
        gc.collect(1 if middle >= 10 else 0)
