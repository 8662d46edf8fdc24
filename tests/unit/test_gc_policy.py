"""The worker's cyclic-GC policy (streams/gcpolicy.py): collections between batches, timed."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from wakeline.streams import gcpolicy


@pytest.fixture
def tuned() -> Iterator[None]:
    saved = gc.get_threshold()
    gcpolicy.tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
        if gcpolicy._timer in gc.callbacks:
            gc.callbacks.remove(gcpolicy._timer)


def test_tune_gc_raises_the_automatic_threshold_and_times_every_collection(tuned: None
                                                                           ) -> None:
    gcpolicy.tune_gc()  # idempotent: one callback
    assert gc.get_threshold()[0] == gcpolicy.GC_THRESHOLD0
    assert gc.callbacks.count(gcpolicy._timer) == 1
    spent = gcpolicy.GC_SPENT
    before = [list(v) for v in spent.values()]
    gc.collect(0)
    gc.collect(2)
    assert spent["collections"][0] == before[0][0] + 1
    assert spent["collections"][2] == before[0][2] + 1
    assert spent["seconds"][2] > before[1][2]
    assert spent["longest"][2] > 0.0


def test_a_batch_boundary_collects_once_enough_was_allocated(tuned: None) -> None:
    spent = gcpolicy.GC_SPENT
    gc.collect()
    n = spent["collections"][0] + spent["collections"][1]
    gcpolicy.collect_between_batches()  # nothing allocated since: no collection
    assert spent["collections"][0] + spent["collections"][1] == n
    kept = [[i] for i in range(gcpolicy.GC_BETWEEN_BATCHES + 1_000)]  # tracked containers
    assert gc.get_count()[0] >= gcpolicy.GC_BETWEEN_BATCHES
    gcpolicy.collect_between_batches()
    assert spent["collections"][0] + spent["collections"][1] == n + 1
    assert gc.get_count()[0] < 1_000
    assert len(kept) > gcpolicy.GC_BETWEEN_BATCHES


def test_one_batch_loop_per_process_collects(tuned: None) -> None:
    """With the conditions agent in the process, the readiness stage's and the derive
    consumer's batch boundaries leave the collecting to it; without it, readiness
    collects, and a process without either lets the derive consumer collect."""
    spent = gcpolicy.GC_SPENT

    def collects(role: str) -> bool:
        gc.collect()
        n = spent["collections"][0] + spent["collections"][1]
        kept = [[i] for i in range(gcpolicy.GC_BETWEEN_BATCHES + 1_000)]
        gcpolicy.collect_between_batches(role)
        assert len(kept) > gcpolicy.GC_BETWEEN_BATCHES
        return spent["collections"][0] + spent["collections"][1] > n

    try:
        gcpolicy.tune_gc(("readiness", "conditions", "derive"))
        assert [collects(r) for r in ("conditions", "readiness", "derive")] == \
            [True, False, False]
        gcpolicy.tune_gc(("derive", "readiness"))
        assert [collects(r) for r in ("conditions", "readiness", "derive")] == \
            [False, True, False]
        gcpolicy.tune_gc(("derive",))
        assert [collects(r) for r in ("conditions", "readiness", "derive")] == \
            [False, False, True]
    finally:
        gcpolicy.tune_gc()
    assert collects("readiness") and collects("derive")  # no roles: every loop collects
