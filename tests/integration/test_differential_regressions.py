"""Minimal histories where the condition core and docs/semantics.md disagreed.

Each test was found by tests/integration/test_differential.py (then minimized by
hand).  Each asserts the documented answer twice: from the SQL oracle (strict, i.e.
without any ``Deviations``) — which must pass — and from the core
(``Simulator.evaluate``) — which fails while the core deviates.

Fixed in bdb7305 / eebda91 (kept as guards): tombstones as pending rows, quiet
holding only once settled, typed distinct_count, naive datetimes in where, the
window hop default.  Fixed later (each was a strict xfail until then): census and
`at` read slot heads before the scope (the core remembers every row of a slot a
head-reading condition looks at); an erasure restores a prior head the core had
forgotten (the core asks for it: ``Step.reload`` → ``SlotRestored``); a removed
transition reads collections/types/statuses on the tombstone, `where` on the head.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.oracle.mirror import mirror
from tests.oracle.sql import evaluate, install
from wakeline.catalog import compile_catalog
from wakeline.store import migrate
from wakeline.testing import Simulator

pytestmark = pytest.mark.integration

START = "2026-01-01T00:00:00Z"

COLLECTIONS = {
    "ev": """
        name: ev
        types: [chat, note]
        scorers: [imp]
        annotators:
          - name: sent
            required: true
            leaves: {valence: number, label: string}
        fields:
          d: datetime
    """,
    "kv": """
        name: kv
        keyed: true
        fields:
          n: number
          d: datetime
    """,
}


def make_sim(root: Path, trigger: str, *, source: str = "[ev, kv]") -> Simulator:
    """A catalog with one derivation ``d`` over ``source`` and inline ``trigger``."""
    (root / "collections").mkdir(parents=True)
    (root / "derivations").mkdir()
    for name, text in COLLECTIONS.items():
        (root / "collections" / f"{name}.yaml").write_text(textwrap.dedent(text))
    (root / "derivations" / "d.yaml").write_text(
        "name: d\nfunction: wlfn:noop\n"
        f"source: {{collections: {source}}}\n"
        "trigger:\n" + textwrap.indent(textwrap.dedent(trigger).strip(), "  ") + "\n")
    (root / "wlfn.py").write_text("def noop(ctx):\n    return []\n")
    return Simulator(compile_catalog(root), start=START)


def block(sim: Simulator, collection: str = "kv") -> int:
    """An unready record at the bottom of the backlog: no run can dispatch, so the
    rows written afterwards stay pending (docs/semantics.md, The mailbox)."""
    if collection == "kv":
        return sim.write(entity="u", collection="kv", key="blocker", ready=False)
    return sim.write(entity="u", collection="ev", type="chat", ready=False)


@pytest.fixture
def oracle_conn(pg_dsn: str) -> Any:
    migrate(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        install(conn)
        yield conn


def answers(conn: psycopg.Connection[Any], sim: Simulator, kind: str
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(core, oracle) answers of ``d.default``'s ``kind`` condition for entity u."""
    with conn.transaction(force_rollback=True):
        mirror(conn, sim)
        ref = evaluate(conn, sim.catalog, "d.default", sim.workspace, "u", sim.now)
    core = next(c for c in sim.evaluate("d.default", "u") if c["kind"] == kind)
    return core, next(r for r in ref if r["kind"] == kind)


def assert_documented(conn: psycopg.Connection[Any], sim: Simulator, kind: str, *,
                      holds: bool, value: Any) -> None:
    core, ref = answers(conn, sim, kind)
    assert (ref["holds"], ref["value"]) == (holds, value), f"oracle: {ref}"
    assert (core["holds"], core["value"]) == (holds, value), f"core: {core}"


# -- tombstones are ready records of the scope ------------------------------------------------
#
# docs/semantics.md: write holds when "∃ ready pending record in T's scope"; a
# record is in scope by collection+version, type, status and where; "Tombstones are
# ready by construction.  Only ready rows are trigger-visible."  Nothing excludes a
# tombstone from write, quiet or the accumulator's pending rows.  The core leaves
# tombstones out of those three — yet counts the same tombstone as fresh pending
# data for census and in lifecycle's total (see the last test), so the core is not
# even consistent with itself.


def test_write_counts_a_pending_tombstone(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "write: {collections: [kv]}", source="[kv]")
    block(sim)                                                       # seq 1, unready
    sim.write(entity="u", collection="kv", key="k", content={"n": 1})  # seq 2
    sim.retract(entity="u", collection="kv", key="k")                # seq 3, tombstone
    # pending ready records in scope: seqs 2 and 3.  Core before the fix: 1 (seqs [2]).
    assert_documented(oracle_conn, sim, "write", holds=True, value=2)


def test_write_fires_on_a_lone_pending_tombstone(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "write: {collections: [kv]}\ncooldown_s: 600", source="[kv]")
    sim.write(entity="u", collection="kv", key="k", content={"n": 1})  # seq 1, runs at once
    assert sim.cursor("d", "u")["watermark"] == 1
    sim.retract(entity="u", collection="kv", key="k")                  # seq 2 (cooling)
    # Core before the fix: holds=False value=0 — the tombstone is invisible to write.
    assert_documented(oracle_conn, sim, "write", holds=True, value=1)


def test_quiet_counts_a_pending_tombstone(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "quiet: {collections: [kv], after_s: 10}", source="[kv]")
    block(sim)
    sim.write(entity="u", collection="kv", key="k", content={"n": 1})
    sim.advance(5)
    sim.retract(entity="u", collection="kv", key="k")                # arrives at +5 s
    sim.advance(10)                                                  # +15 s
    # settles at last arrival (+5 s) + 10 s = +15 s over seqs 2 and 3.
    # Core before the fix: value 1 and settles_at +10 s (it ignores the tombstone's arrival).
    core, ref = answers(oracle_conn, sim, "quiet")
    assert (ref["holds"], ref["value"]) == (True, 2)
    assert ref["detail"]["settles_at"] == sim.now.timestamp()
    assert core["value"] == 2, core


def test_accumulator_count_includes_a_pending_tombstone(tmp_path: Path,
                                                        oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "accumulator: {metric: count, threshold: 2}", source="[kv]")
    block(sim)
    sim.write(entity="u", collection="kv", key="k", content={"n": 1})
    sim.retract(entity="u", collection="kv", key="k")
    # pending rows of the driving source: 2 and 3 → count 2 >= 2.  Core before the fix: 1.0, holds False.
    assert_documented(oracle_conn, sim, "accumulator", holds=True, value=2.0)


def test_core_counts_tombstones_for_census_freshness_and_lifecycle(
        tmp_path: Path, oracle_conn: Any) -> None:
    """Passes: the same tombstone *is* pending data for census and lifecycle."""
    sim = make_sim(tmp_path, "census: {collections: [ev], threshold: 1}\n"
                             "lifecycle: {total_records: 2}", source="[ev, kv]")
    sim.write(entity="u", collection="ev", type="chat")               # seq 1
    sim.manual("d", "u")
    sim.write(entity="u", collection="kv", key="k", ready=False)       # seq 2 blocks
    sim.write(entity="u", collection="kv", key="j", content={"n": 1})  # seq 3
    sim.manual("d", "u")                                               # cannot dispatch
    assert sim.cursor("d", "u")["watermark"] == 1
    sim.retract(entity="u", collection="kv", key="j")                  # seq 4
    sim.delete(3)  # only the tombstone is pending and ready now
    census, _ = answers(oracle_conn, sim, "census")
    lifecycle, _ = answers(oracle_conn, sim, "lifecycle")
    assert census["holds"] and lifecycle["holds"] and lifecycle["value"] == 2
    assert_documented(oracle_conn, sim, "census", holds=True, value=1)
    assert_documented(oracle_conn, sim, "lifecycle", holds=True, value=2)


# -- quiet: holds before it settles ------------------------------------------------------------
#
# docs/semantics.md, Time conditions: quiet holds when "∃ ready pending record in
# scope, and now >= max(enriched_at of those) + after_s".  The core's evaluate
# reports holds=True as soon as a record is pending, with the settle instant as its
# permitted time (the job then waits).  Behaviourally equivalent through the mailbox,
# but "holds" means two different things.  Ambiguity: see the report; proposal — the
# doc's table reads "armed when ∃ pending; run_after = settle", like `at`.


def test_quiet_does_not_hold_before_settling(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "quiet: {after_s: 10}", source="[ev]")
    sim.write(entity="u", collection="ev", type="chat")
    core, ref = answers(oracle_conn, sim, "quiet")
    assert (ref["holds"], ref["value"], ref["detail"]["armed"]) == (False, 1, True)
    assert ref["detail"]["settles_at"] == sim.now.timestamp() + 10
    assert core["holds"] is False, core   # core: True, permitted = now + 10


# -- distinct_count ------------------------------------------------------------------------------
#
# docs/semantics.md, Accumulator values: "A value is present when it is a number (not
# a boolean) ... distinct_count counts distinct present values (any JSON scalar for
# annotation leaves)."


def test_scorer_distinct_count_ignores_non_numbers(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "accumulator:\n"
                             "  metric: {scorer: imp, aggregate: distinct_count}\n"
                             "  threshold: 2", source="[ev]")
    block(sim, "ev")
    for value in (1, True, "3", [2]):
        sim.write(entity="u", collection="ev", type="chat", scores={"imp": value})
    # present (numeric) scores: {1} → 1.  Core before the fix: 4.0 (every non-null value), holds.
    assert_documented(oracle_conn, sim, "accumulator", holds=False, value=1.0)


def test_annotation_distinct_count_ignores_arrays_and_objects(tmp_path: Path,
                                                              oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "accumulator:\n"
                             "  metric: {annotation: sent, path: label, "
                             "aggregate: distinct_count}\n"
                             "  threshold: 1", source="[ev]")
    block(sim, "ev")
    for value in ([1], [2], {"a": 1}):
        sim.write(entity="u", collection="ev", type="chat",
                  annotations={"sent": {"label": value}})
    # no JSON scalar present → 0 distinct.  Core before the fix: 3.0, holds.
    assert_documented(oracle_conn, sim, "accumulator", holds=False, value=0.0)


def test_distinct_count_true_and_one_are_distinct(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "accumulator:\n"
                             "  metric: {annotation: sent, path: label, "
                             "aggregate: distinct_count}\n"
                             "  threshold: 2", source="[ev]")
    block(sim, "ev")
    for value in (True, 1, False, 0):
        sim.write(entity="u", collection="ev", type="chat",
                  annotations={"sent": {"label": value}})
    # JSON scalars true, 1, false, 0 are four distinct values.  Core before the fix: 2.0 (Python's
    # True == 1, False == 0).
    assert_documented(oracle_conn, sim, "accumulator", holds=True, value=4.0)


# -- datetimes without a zone ----------------------------------------------------------------------
#
# docs/semantics.md, where predicates: "datetime compares instants (ISO-8601 strings
# with a zone; a value that does not parse fails)".  In where predicates the core
# reads naive strings and bare dates as UTC; its `at` condition rejects the same
# values — so the two disagree with each other too.


@pytest.mark.parametrize("value", ["2026-01-01T00:10:00", "2026-01-01"])
def test_where_naive_datetime_is_not_an_instant(tmp_path: Path, oracle_conn: Any,
                                                value: str) -> None:
    sim = make_sim(tmp_path, 'write: {where: {d: {gte: "2025-12-31T00:00:00Z"}}}',
                   source="[kv]")
    block(sim)
    sim.write(entity="u", collection="kv", key="k", content={"d": value})
    # Core before the fix: holds=True value=1.
    assert_documented(oracle_conn, sim, "write", holds=False, value=0)


@pytest.mark.parametrize("value", ["2026-01-01T00:10:00", "2026-01-01"])
def test_at_naive_datetime_is_not_a_deadline(tmp_path: Path, oracle_conn: Any,
                                             value: str) -> None:
    """Passes: the core's `at` already rejects naive values (contrast with where)."""
    sim = make_sim(tmp_path, "at: {field: d}", source="[kv]")
    sim.write(entity="u", collection="kv", key="k", content={"d": value})
    assert_documented(oracle_conn, sim, "at", holds=False, value=None)


# -- current records are slot heads, then the scope ----------------------------------------------
#
# docs/semantics.md, Terms: "Current records of a scope: for keyed collections, the
# heads (not tombstones) of every slot, that are in scope".  The head is the slot's
# last ready active row by seq, *then* the scope is applied.  The core used to apply
# the scope first and keep, per slot, the latest row that matched it — so a newer
# version that left the scope (another type, a where value that no longer matches)
# left the old version standing.  It now remembers every active row of a keyed
# collection that a census, at, changed or retraction condition reads
# (Plan.slot_collections), in scope or not.


def test_census_slot_head_leaving_the_scope(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "census: {collections: [kv], types: [pref], threshold: 1}",
                   source="[ev]")
    sim.write(entity="u", collection="kv", key="k", type="pref", content={"n": 1})
    sim.write(entity="u", collection="kv", key="k", type="other", content={"n": 2})
    # head of kv.k is seq 2, type other → not in scope → 0 current records.
    # Core before the fix: 1 (seq 1, the latest pref row).
    assert_documented(oracle_conn, sim, "census", holds=False, value=0)


def test_census_where_value_leaving_the_scope(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "census:\n  collections: [kv]\n  where: {n: {gte: 1}}\n"
                             "  threshold: 1", source="[ev]")
    sim.write(entity="u", collection="kv", key="k", content={"n": 5})
    sim.write(entity="u", collection="kv", key="k", content={"n": 0})
    # Core before the fix: 1 — the superseded value n=5 still counts.
    assert_documented(oracle_conn, sim, "census", holds=False, value=0)


def test_at_slot_head_leaving_the_scope(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "at: {collections: [kv], types: [pref], field: d}",
                   source="[ev]")
    sim.write(entity="u", collection="kv", key="k", type="pref",
              content={"d": "2026-01-01T01:00:00Z"})
    sim.write(entity="u", collection="kv", key="k", type="other",
              content={"d": "2026-01-01T02:00:00Z"})
    # the head (seq 2) is out of scope: no deadline.  Core before the fix: 01:00 from the
    # superseded seq 1 — a reminder for a calendar entry that was moved out of scope.
    assert_documented(oracle_conn, sim, "at", holds=False, value=None)


def test_at_rewrite_without_a_deadline_cancels_it(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "at: {collections: [kv], field: d}", source="[ev]")
    sim.write(entity="u", collection="kv", key="k", content={"d": "2026-01-01T00:10:00Z"})
    sim.write(entity="u", collection="kv", key="k", content={"d": "not a date"})
    # docs/semantics.md: "only the head of a slot carries a deadline, so a new version
    # of the slot or its tombstone re-arms or cancels the old deadline" — the head has
    # none.  Core before the fix: 00:10 from the superseded version (a tombstone does cancel it).
    assert_documented(oracle_conn, sim, "at", holds=False, value=None)


def test_slot_heads_are_right_when_the_collection_is_a_driving_source(
        tmp_path: Path, oracle_conn: Any) -> None:
    """Passes: with kv in the driving source the same history is answered right."""
    sim = make_sim(tmp_path, "census: {collections: [kv], types: [pref], threshold: 1}",
                   source="[kv]")
    sim.write(entity="u", collection="kv", key="k", type="pref", content={"n": 1})
    sim.write(entity="u", collection="kv", key="k", type="other", content={"n": 2})
    assert_documented(oracle_conn, sim, "census", holds=False, value=0)


# -- erasure restores the prior head ---------------------------------------------------------------
#
# Seed: "erasure restores prior heads without writing new rows"; docs/semantics.md:
# every definition is a function of the rows.  After the head of a slot is deleted,
# the previous ready active row is the head again.  The core forgets rows a cursor
# has consumed; it used to leave the slot empty when the prior head was at or below
# the watermark.  Now, when the oldest row it kept leaves the chain, the step asks
# for the prior row (Step.reload) and the runtime answers from PostgreSQL
# (SlotRestored).


def test_erasure_restores_a_consumed_head_for_census(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "census: {collections: [kv], threshold: 1}", source="[kv]")
    sim.write(entity="u", collection="kv", key="k", content={"n": 1})   # seq 1, consumed
    newer = sim.write(entity="u", collection="kv", key="k", content={"n": 2})
    assert sim.cursor("d", "u")["watermark"] == 2
    sim.delete(newer)
    # current records: seq 1 (the restored head) → 1.  Core before the fix: 0.
    assert_documented(oracle_conn, sim, "census", holds=False, value=1)


def test_erasure_restores_a_consumed_head_for_at(tmp_path: Path, oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "write: {collections: [kv]}\nat: {collections: [kv], field: d}",
                   source="[kv]")
    sim.write(entity="u", collection="kv", key="k", content={"d": "2026-01-01T01:00:00Z"})
    newer = sim.write(entity="u", collection="kv", key="k",
                      content={"d": "2026-01-01T02:00:00Z"})
    assert sim.cursor("d", "u")["watermark"] == 2
    sim.delete(newer)
    # the restored head's deadline 01:00 is unhandled (handled through 00:00).
    # Core before the fix: None.
    assert_documented(oracle_conn, sim, "at", holds=True, value=1767229200.0)


def test_erasure_restores_a_consumed_head_for_changed(tmp_path: Path,
                                                     oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "changed: {collections: [kv]}\ncooldown_s: 600", source="[kv]")
    sim.write(entity="u", collection="kv", key="k", content={"n": 1})   # seq 1: added, runs
    newer = sim.write(entity="u", collection="kv", key="k", content={"n": 2})  # cooling
    sim.advance(600)                                                    # runs, W = 2
    assert sim.cursor("d", "u")["watermark"] == 2
    sim.delete(newer)                                                   # head: seq 1 again
    sim.write(entity="u", collection="kv", key="k", content={"n": 1})   # seq 3 (cooling)
    # seq 3 against its predecessor seq 1: byte-identical → no transition.
    # Core before the fix: 'added' (it forgot seq 1).
    assert_documented(oracle_conn, sim, "changed", holds=False, value=0)


def test_erasure_restores_an_unconsumed_head(tmp_path: Path, oracle_conn: Any) -> None:
    """Passes: when no cursor consumed the prior head, the core restores it."""
    sim = make_sim(tmp_path, "at: {collections: [kv], field: d}", source="[ev]")
    sim.write(entity="u", collection="kv", key="k", content={"d": "2026-01-01T01:00:00Z"})
    newer = sim.write(entity="u", collection="kv", key="k",
                      content={"d": "2026-01-01T02:00:00Z"})
    sim.delete(newer)
    assert_documented(oracle_conn, sim, "at", holds=True, value=1767229200.0)


# -- the window hop default ---------------------------------------------------------------------
#
# docs/semantics.md, Windows: "`hop_s` defaults to `min(60, size_s)`".  The catalog
# compiler defaulted it to size_s (a tumbling window); fixed in eebda91.  The oracle
# reads the normalized Window, so only this test can see it.


def test_window_hop_defaults_to_min_60_and_size(tmp_path: Path) -> None:
    sim = make_sim(tmp_path, "accumulator: {metric: count, threshold: 5, "
                             "window: {size_s: 600}}", source="[ev]")
    cond = sim.catalog.triggers["d.default"].conditions[0]
    assert cond.window is not None
    assert cond.window.hop_s == 60, cond.window   # compiler before eebda91: 600


# -- the scope of a removed transition -------------------------------------------------------------
#
# docs/semantics.md: changed holds for "a ready record r in scope" ... "for a removed
# transition, where is evaluated on the retracted head".  So collections, types and
# statuses are read on r (the tombstone, which copies the head's type when written)
# and only `where` on the head.  The core used to also require the retracted head to
# be in scope; the two differ only when the head was edited in place after the
# retraction.  Settled on the doc's reading.


def test_removed_transition_types_are_read_from_the_tombstone(tmp_path: Path,
                                                              oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "retraction: {types: [pref]}", source="[kv]")
    block(sim)
    head = sim.write(entity="u", collection="kv", key="k", type="pref", content={"n": 1})
    sim.retract(entity="u", collection="kv", key="k")                # tombstone type pref
    sim.update(head, type="other")                                   # in-place edit
    # r (the tombstone) is in scope and retracts a live head → removed.  Core before the fix: 0.
    assert_documented(oracle_conn, sim, "retraction", holds=True, value=1)


# -- settled readings (docs/semantics.md) ---------------------------------------------------------


@pytest.mark.parametrize("value", ["2026-W01-4T00:10:00Z", "2026-01-01T00Z",
                                   " 2026-01-01T00:10:00Z", "2026-01-01T00:10:00.1234567Z"])
def test_where_datetime_outside_the_grammar_is_not_an_instant(tmp_path: Path,
                                                              oracle_conn: Any,
                                                              value: str) -> None:
    """Python's fromisoformat reads week dates, hour-only times, padding and 7-digit
    fractions; the documented grammar (RFC 3339 profile) does not."""
    sim = make_sim(tmp_path, 'write: {where: {d: {gte: "2025-12-31T00:00:00Z"}}}',
                   source="[kv]")
    block(sim)
    sim.write(entity="u", collection="kv", key="k", content={"d": value})
    assert_documented(oracle_conn, sim, "write", holds=False, value=0)


@pytest.mark.parametrize("value", ["2026-01-01 00:10:00Z", "20260101T001000Z",
                                   "2026-01-01T00:10:00+01"])
def test_where_datetime_in_the_grammar_is_an_instant(tmp_path: Path, oracle_conn: Any,
                                                     value: str) -> None:
    sim = make_sim(tmp_path, 'write: {where: {d: {gte: "2025-12-31T00:00:00Z"}}}',
                   source="[kv]")
    block(sim)
    sim.write(entity="u", collection="kv", key="k", content={"d": value})
    assert_documented(oracle_conn, sim, "write", holds=True, value=1)


def test_count_of_a_string_leaf_counts_the_rows_that_carry_it(tmp_path: Path,
                                                              oracle_conn: Any) -> None:
    """The compiler suggests `aggregate: count` for a non-numeric leaf; it counts rows
    whose leaf holds a JSON scalar (before: 0, as only numbers were present)."""
    sim = make_sim(tmp_path, "accumulator:\n"
                             "  metric: {annotation: sent, path: label, aggregate: count}\n"
                             "  threshold: 2", source="[ev]")
    block(sim, "ev")
    for label in ("sad", None, "calm"):
        sim.write(entity="u", collection="ev", type="chat",
                  annotations={"sent": {"label": label}})
    assert_documented(oracle_conn, sim, "accumulator", holds=True, value=2.0)


def test_lifecycle_with_both_milestones_holds_on_either(tmp_path: Path,
                                                        oracle_conn: Any) -> None:
    sim = make_sim(tmp_path, "lifecycle: {first_record: true, total_records: 3}\n"
                             "cooldown_s: 600", source="[ev]")
    sim.write(entity="u", collection="ev", type="chat")        # first record: runs
    assert sim.cursor("d", "u")["watermark"] == 1
    sim.write(entity="u", collection="ev", type="chat")        # total 2: neither
    assert_documented(oracle_conn, sim, "lifecycle", holds=False, value=2)
    sim.write(entity="u", collection="ev", type="chat")        # total 3: the second
    assert_documented(oracle_conn, sim, "lifecycle", holds=True, value=3)
