"""The core's state: serializable, order-independent, rebuildable from rows, idempotent."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from wakeline.core.events import RecordChanged
from wakeline.core.rebuild import CursorRow, rebuild
from wakeline.core.state import EntityState
from tests.unit.core.helpers import catalog_dir, chat, derivation, sim_for

DERIVS = {
    "w": derivation("w", "write: {where: {priority: {gte: 2}}}\ncooldown_s: 100"),
    "acc": derivation("acc", "accumulator: {metric: importance, threshold: 10}"),
    "q": derivation("q", "quiet: {after_s: 300}"),
    "ch": derivation("ch", "changed: {keys: [role]}", source="collections: [profiles]"),
    "ce": derivation("ce", "census: {collections: [relations], threshold: 2}"),
    "lc": derivation("lc", "lifecycle: {total_records: 4}"),
    "at": derivation("at", "at: {collections: [calendar], field: starts_at, offset_s: 60}",
                     source="collections: [calendar]", mode="current"),
}


def random_history(sim, rnd: random.Random, steps: int) -> None:
    unready: list[int] = []
    for _ in range(steps):
        op = rnd.random()
        if op < 0.35:
            s = chat(sim, content={"priority": rnd.randint(0, 3)},
                     scores={"importance": rnd.randint(0, 6)}, ready=rnd.random() < 0.7)
            if not sim.records[s].ready:
                unready.append(s)
        elif op < 0.5 and unready:
            sim.mark_ready(unready.pop(rnd.randrange(len(unready))))
        elif op < 0.65:
            sim.write(entity="user:mia", collection="profiles", key=rnd.choice(["role", "city"]),
                      content={"value": rnd.choice(["a", "b"])})
        elif op < 0.7 and sim.head("user:mia", "profiles", "role") and \
                not sim.head("user:mia", "profiles", "role").tombstone:
            sim.retract(entity="user:mia", collection="profiles", key="role")
        elif op < 0.78:
            sim.write(entity="user:mia", collection="relations", type="contradiction",
                      content={"topic": "t"})
        elif op < 0.85:
            sim.write(entity="user:mia", collection="calendar", key=rnd.choice(["x", "y"]),
                      content={"starts_at": f"2026-07-19T{rnd.randint(9, 12):02d}:00:00Z"})
        elif op < 0.9:
            sim.manual(rnd.choice(list(DERIVS)), "user:mia")
        else:
            sim.advance(rnd.choice([1, 30, 120, 400, 3600]))


def answers(sim):
    return {t: [(c["kind"], c["holds"], c["value"]) for c in sim.evaluate(t, "user:mia")]
            for t in sorted(sim.plan.triggers)}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(5, 40))
def test_state_rebuilt_from_rows_evaluates_identically(tmp_path_factory, seed, steps):
    tmp = tmp_path_factory.mktemp("cat")
    sim = sim_for(tmp, DERIVS)
    random_history(sim, random.Random(seed), steps)
    live = answers(sim)
    mia = [r for s, r in sim.records.items() if sim._entity_of[s] == "user:mia"]
    cursors = [CursorRow(d, sim.states["user:mia"].d(d).w, sim.states["user:mia"].d(d).last_success,
                         sim.states["user:mia"].d(d).last_run, sim.states["user:mia"].d(d).handled)
               for d in sim.plan.derivations] if "user:mia" in sim.states else []
    step = rebuild(sim.engine, "default", "user:mia", mia, cursors, sim.now.timestamp())
    sim.states["user:mia"] = step.state
    assert answers(sim) == live


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32))
def test_state_round_trips_through_json(tmp_path_factory, seed):
    sim = sim_for(tmp_path_factory.mktemp("cat"), DERIVS)
    random_history(sim, random.Random(seed), 25)
    before = answers(sim)
    for entity, state in list(sim.states.items()):
        text = json.dumps(state.to_dict())
        sim.states[entity] = EntityState.from_dict(json.loads(text))
    assert answers(sim) == before


def test_redelivered_change_is_skipped(tmp_path):
    sim = sim_for(tmp_path, {"lc": DERIVS["lc"], "acc": DERIVS["acc"]})
    chat(sim, scores={"importance": 4})
    st_ = sim.states["user:mia"]
    lsn = 1  # the simulator's first change: this record's
    rec = sim.records[1]
    total = st_.d("lc").total
    step = sim.engine.apply(st_, RecordChanged("c", rec, None, lsn), sim.now.timestamp())
    assert step.duplicate and step.state.d("lc").total == total


def test_rows_of_one_copy_share_a_position_and_each_is_applied_once(tmp_path):
    """PostgreSQL writes the rows of one COPY in multi-insert WAL records, every row of
    one record at the same LSN: the redelivery guard orders an entity's changes by
    position, then by the record's seq (engine.order_of), so each row is applied, and
    each again is a redelivery."""
    from wakeline.core.plan import Rec

    sim = sim_for(tmp_path, {"acc": DERIVS["acc"]})
    eng, now = sim.engine, sim.now.timestamp()
    st_ = EntityState("default", "user:zoe")
    recs = [Rec(seq, "main", 1, "chat", "active", None, {}, "", False,
                {"mood_v1": {"valence": 0.0, "label": "calm"}}, {"importance": 1}, now, now)
            for seq in (11, 12, 13)]
    for rec in recs:  # one COPY: the same position
        step = eng.apply(st_, RecordChanged("c", rec, None, 7), now)
        assert not step.duplicate
        st_ = step.state
    assert st_.d("acc").total == 3
    for rec in recs:  # redelivered, each at its own place
        assert eng.apply(st_, RecordChanged("c", rec, None, 7), now).duplicate
    assert st_.d("acc").total == 3
    later = Rec(5, "main", 1, "chat", "active", None, {}, "", False,
                {"mood_v1": {"valence": 0.0, "label": "calm"}}, {"importance": 1}, now, now)
    assert not eng.apply(st_, RecordChanged("c", later, None, 8), now).duplicate  # a later
    # position wins whatever its seq


def test_a_position_stored_before_seqs_joined_the_order_still_guards(tmp_path):
    """A state stored by the previous version holds the bare position of its last
    change: every change at that position was applied, the next one is new."""
    from wakeline.core.plan import Rec

    sim = sim_for(tmp_path, {"acc": DERIVS["acc"]})
    eng, now = sim.engine, sim.now.timestamp()
    st_ = EntityState("default", "user:zoe", last_lsn=(5 << 64) | 9)  # prev commit 5, lsn 9
    rec = Rec(99, "main", 1, "chat", "active", None, {}, "", False,
              {"mood_v1": {"valence": 0.0, "label": "calm"}}, {"importance": 1}, now, now)
    assert eng.apply(st_, RecordChanged("c", rec, None, (5 << 64) | 9), now).duplicate
    assert not eng.apply(st_, RecordChanged("c", rec, None, (5 << 64) | 10), now).duplicate


def test_state_stays_small_after_consumption(tmp_path):
    sim = sim_for(tmp_path, {"w": derivation("w", "write: {}")})
    for _ in range(200):
        chat(sim)
    st_ = sim.states["user:mia"]
    assert len(st_.facts) == 0, "consumed event rows with no census/at use are folded away"
    assert len(json.dumps(st_.to_dict())) < 600


def test_catalog_dir_helper_is_used(tmp_path):
    assert (catalog_dir(tmp_path, {"w": DERIVS["w"]}) / "collections" / "main.yaml").exists()
