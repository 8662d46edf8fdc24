"""Erasure restores prior heads: the reload protocol between the core and its caller.

The core forgets chain rows every cursor consumed.  When the oldest row it kept
leaves the chain (a delete, or it stops being active), the step names the slot in
``Step.reload``; the caller answers with ``SlotRestored`` read from PostgreSQL (the
Simulator from its own rows).  These tests drive the Engine directly.
"""

from __future__ import annotations

from pathlib import Path

from wakeline.catalog import compile_catalog
from wakeline.core.build import build_plan
from wakeline.core.engine import Engine
from wakeline.core.events import CursorAdvanced, RecordChanged, SlotRestored
from wakeline.core.plan import Rec
from wakeline.core.state import EntityState
from tests.unit.core.helpers import catalog_dir, derivation


def engine(tmp_path: Path) -> Engine:
    root = catalog_dir(tmp_path, {
        "ce": derivation("ce", "census: {collections: [profiles], threshold: 1}",
                         source="collections: [profiles]"),
    })
    return Engine(build_plan(compile_catalog(root)))


def row(seq: int, value: str, **kw) -> Rec:
    kw.setdefault("enriched_at", 100.0 + seq)
    return Rec(seq, "profiles", key="role", content={"value": value}, created_at=100.0 + seq,
               **kw)


def census(eng: Engine, st: EntityState, now: float = 200.0) -> dict:
    [c] = [c for c in eng.explain(st, "ce.default", now) if c["condition"] == "census"]
    return c


def consumed_history(eng: Engine) -> EntityState:
    st = EntityState("default", "u")
    for seq, value in ((1, "a"), (2, "b")):
        st = eng.apply(st, RecordChanged("c", row(seq, value), lsn=seq), 150.0).state
    st = eng.apply(st, CursorAdvanced("ce", 2, 160.0, "succeeded", lsn=3), 160.0).state
    return st


def test_consumed_rows_before_the_head_are_forgotten(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    st = consumed_history(eng)
    assert sorted(st.facts) == [2]


def test_erasing_the_head_asks_for_the_prior_one_and_restores_it(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    st = consumed_history(eng)
    step = eng.apply(st, RecordChanged("d", None, row(2, "b"), lsn=4), 170.0)
    assert step.reload == [("profiles", "role", 2)]
    assert census(eng, step.state)["value"] == 0          # not restored yet
    restored = eng.apply(step.state, SlotRestored("profiles", "role", 2, row(1, "a")), 170.0)
    assert sorted(restored.state.facts) == [1]
    assert census(eng, restored.state)["value"] == 1
    assert restored.state.d("ce").total == 1              # counted once, when it arrived


def test_no_reload_while_an_older_row_is_still_kept(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    st = EntityState("default", "u")
    for seq, value in ((1, "a"), (2, "b")):   # nothing consumed: both rows are pending
        st = eng.apply(st, RecordChanged("c", row(seq, value), lsn=seq), 150.0).state
    step = eng.apply(st, RecordChanged("d", None, row(2, "b"), lsn=3), 170.0)
    assert step.reload == []
    assert census(eng, step.state)["value"] == 1


def test_archiving_the_only_kept_row_asks_too(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    st = consumed_history(eng)
    step = eng.apply(st, RecordChanged("u", row(2, "b", status="archived"), row(2, "b"),
                                       lsn=4), 170.0)
    assert step.reload == [("profiles", "role", 2)]


def test_a_stale_or_foreign_answer_is_ignored(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    st = consumed_history(eng)
    st = eng.apply(st, RecordChanged("d", None, row(2, "b"), lsn=4), 170.0).state
    for answer in (SlotRestored("profiles", "role", 2, None),
                   SlotRestored("profiles", "role", 2, row(3, "newer")),      # not below
                   SlotRestored("profiles", "city", 2, row(1, "a")),          # other slot
                   SlotRestored("profiles", "role", 2, row(1, "a", enriched_at=None))):
        st = eng.apply(st, answer, 170.0).state
    assert st.facts == {}
