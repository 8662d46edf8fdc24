"""Data conditions through the simulator: write, where, changed, retraction,
accumulator, census, lifecycle — with the seed's own examples."""

from __future__ import annotations

import pytest

from wakeline.core.outcomes import OutcomeKind
from tests.unit.core.helpers import chat, derivation, reasons, sim_for


def test_write_fires_once_per_ready_batch(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {collections: [main], types: [chat]}")})
    chat(sim)
    assert reasons(sim) == [["trigger:d.default:write"]]
    assert sim.runs[-1]["records_consumed"] == 1
    chat(sim, type="observation")  # out of the write scope: no run
    assert len(sim.runs) == 1
    chat(sim)
    assert len(sim.runs) == 2 and sim.runs[-1]["records_consumed"] == 2


def test_unready_record_is_invisible_until_ready(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {}")})
    seq = chat(sim, ready=False)
    assert sim.runs == [] and sim.jobs == []
    sim.mark_ready(seq, scores={"importance": 3})
    assert reasons(sim) == [["trigger:d.default:write"]]


@pytest.mark.parametrize("where,content,fires", [
    ({"priority": {"gte": 3}}, {"priority": 3}, True),
    ({"priority": {"gt": 3}}, {"priority": 3}, False),
    ({"priority": {"lt": 3}}, {"priority": 2}, True),
    ({"priority": {"lte": 1}}, {"priority": 2}, False),
    ({"priority": {"eq": 2}}, {"priority": 2.0}, True),
    ({"priority": {"in": [1, 2]}}, {"priority": 2}, True),
    ({"priority": {"in": [1, 2]}}, {"priority": "2"}, False),   # typed: a string is no integer
    ({"weight": {"gt": 0.5}}, {"weight": 0.75}, True),
    ({"weight": {"gt": 0.5}}, {"weight": True}, False),         # booleans are not numbers
    ({"session": {"eq": "s1"}}, {"session": "s1"}, True),
    ({"session": {"gt": "b"}}, {"session": "c"}, True),          # strings compare by code point
    ({"session": {"exists": True}}, {"session": "x"}, True),
    ({"session": {"exists": True}}, {}, False),
    ({"session": {"exists": False}}, {}, True),
    ({"session": {"exists": False}}, {"session": None}, True),   # null counts as absent
    ({"when": {"gte": "2026-07-19T08:00:00Z"}}, {"when": "2026-07-19T10:00:00+02:00"}, True),
    ({"when": {"gt": "2026-07-19T08:00:00Z"}}, {"when": "2026-07-19T09:00:00+02:00"}, False),
    ({"when": {"gt": "2026-07-19T08:00:00Z"}}, {"when": "not a date"}, False),
    ({"tags": {"contains_any": ["deadline", "x"]}}, {"tags": ["deadline"]}, True),
    ({"tags": {"contains_any": ["x"]}}, {"tags": ["deadline"]}, False),
    ({"tags": {"contains_all": ["a", "b"]}}, {"tags": ["b", "a", "c"]}, True),
    ({"tags": {"contains_all": ["a", "b"]}}, {"tags": ["a"]}, False),
    ({"tags": {"eq": ["a", "b"]}}, {"tags": ["a", "b"]}, True),
    ({"tags": {"eq": ["a", "b"]}}, {"tags": ["b", "a"]}, False),
    ({"urgent": {"eq": True}}, {"urgent": True}, True),
    ({"valence": {"lt": 0}}, {}, True),                          # annotation-backed (see below)
])
def test_where_operators(tmp_path, where, content, fires):
    import yaml
    trig = yaml.safe_dump({"write": {"where": where}}, default_flow_style=True)
    sim = sim_for(tmp_path, {"d": derivation("d", trig)})
    chat(sim, content=content, annotations={"mood_v1": {"valence": -0.5, "label": "sad"}})
    assert bool(sim.runs) is fires


def test_where_combines_operators_as_conjunction(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {where: {priority: {gte: 2, lt: 5}}}")})
    chat(sim, content={"priority": 5})
    assert sim.runs == []
    chat(sim, content={"priority": 4})
    assert len(sim.runs) == 1


PROFILE_SOURCE = "collections: [profiles]"


def test_changed_transitions_and_byte_identical_rewrite(tmp_path):
    sim = sim_for(tmp_path, {"k": derivation(
        "k", "changed: {collections: [profiles], keys: [role]}", source=PROFILE_SOURCE)})
    def put(key, value):
        return sim.write(entity="user:mia", collection="profiles", key=key,
                         content={"value": value}, text=value)
    put("role", "engineer")
    assert reasons(sim) == [["trigger:k.default:changed"]]
    put("role", "engineer")              # byte-identical rewrite: never fires
    assert len(sim.runs) == 1
    assert sim.outcomes_of(OutcomeKind.NO_TRANSITION)
    put("city", "Oslo")                  # not a watched key
    assert len(sim.runs) == 1
    put("role", "manager")               # changed
    assert len(sim.runs) == 2
    sim.retract(entity="user:mia", collection="profiles", key="role")  # removed
    assert len(sim.runs) == 3
    put("role", "manager")               # added after a tombstone
    assert len(sim.runs) == 4


def test_changed_transition_filter(tmp_path):
    sim = sim_for(tmp_path, {"k": derivation(
        "k", "changed: {transitions: [removed]}", source=PROFILE_SOURCE)})
    sim.write(entity="e", collection="profiles", key="role", content={"value": "a"})
    sim.write(entity="e", collection="profiles", key="role", content={"value": "b"})
    assert sim.runs == []
    sim.retract(entity="e", collection="profiles", key="role")
    assert reasons(sim) == [["trigger:k.default:changed"]]


def test_retraction_fires_on_tombstone_only(tmp_path):
    sim = sim_for(tmp_path, {"r": derivation("r", "retraction: {}", source=PROFILE_SOURCE)})
    sim.write(entity="e", collection="profiles", key="role", content={"value": "a"})
    sim.write(entity="e", collection="profiles", key="role", content={"value": "b"})
    assert sim.runs == []
    sim.retract(entity="e", collection="profiles", key="role")
    assert reasons(sim) == [["trigger:r.default:retraction"]]


def test_changed_chain_across_derivations(tmp_path):
    """profiles.role actually changing re-derives downstream; a re-emit of the same value does not."""
    sim = sim_for(tmp_path, {
        "up": derivation("up", "write: {}", function="simfuncs:echo_profile",
                         emits="[profiles]"),
        "down": derivation("down", "changed: {collections: [profiles], keys: [role]}",
                           source=PROFILE_SOURCE),
    })
    chat(sim, content={"set": "role", "value": "engineer"})
    assert [r["derivation"] for r in sim.runs] == ["up", "down"]
    chat(sim, content={"set": "role", "value": "engineer"})   # same value re-emitted
    assert [r["derivation"] for r in sim.runs] == ["up", "down", "up"]
    chat(sim, content={"set": "role", "value": "cto"})
    assert [r["derivation"] for r in sim.runs][-2:] == ["up", "down"]


def test_accumulator_scorer_shorthand_and_watermark_reset(tmp_path):
    sim = sim_for(tmp_path, {"p": derivation("p", "accumulator: {metric: importance, threshold: 100}")})
    for _ in range(9):
        chat(sim, scores={"importance": 10})
    assert sim.runs == []
    below = sim.outcomes_of(OutcomeKind.BELOW_THRESHOLD)[-1]
    assert below.detail["value"] == 90
    chat(sim, scores={"importance": 10})
    assert reasons(sim) == [["trigger:p.default:threshold"]]
    assert sim.runs[0]["records_consumed"] == 10
    chat(sim, scores={"importance": 10})     # the run advanced the watermark: the reset
    assert len(sim.runs) == 1


def test_accumulator_missing_values_and_aggregates(tmp_path):
    sim = sim_for(tmp_path, {
        "s": derivation("s", "accumulator: {metric: {scorer: importance, aggregate: max}, threshold: 9}"),
        "a": derivation("a", "accumulator: {metric: {annotation: mood_v1, path: valence, aggregate: avg}, threshold: -0.25, comparison: lte}"),
        "c": derivation("c", "accumulator: {metric: count, threshold: 3}"),
        "dc": derivation("dc", "accumulator: {metric: {annotation: mood_v1, path: label, aggregate: distinct_count}, threshold: 2}"),
        "mn": derivation("mn", "accumulator: {metric: {scorer: importance, aggregate: min}, threshold: 1, comparison: lte}"),
        "sm": derivation("sm", "accumulator: {metric: {scorer: importance, aggregate: sum}, threshold: 5}"),
        "ct": derivation("ct", "accumulator: {metric: {scorer: importance, aggregate: count}, threshold: 2}"),
    })
    chat(sim, annotations={"mood_v1": {"label": "calm"}})   # no score, no valence
    ran = {r["derivation"] for r in sim.runs}
    assert ran == set(), "avg/max/min of nothing missing never fire; count needs 3"
    chat(sim, scores={"importance": 4}, annotations={"mood_v1": {"valence": -0.5, "label": "sad"}})
    ran = {r["derivation"] for r in sim.runs}
    # avg ignores the missing valence: -0.5 <= -0.25; distinct labels: 2; count of scores: 1
    assert ran == {"a", "dc"}
    chat(sim, scores={"importance": 9})
    ran = [r["derivation"] for r in sim.runs]
    assert "s" in ran and "c" in ran and "sm" in ran and "ct" in ran
    assert "mn" not in ran
    chat(sim, scores={"importance": 0.5})
    assert "mn" in [r["derivation"] for r in sim.runs]


def test_accumulator_lte_never_fires_on_empty_backlog(tmp_path):
    sim = sim_for(tmp_path, {"a": derivation(
        "a", "accumulator: {metric: {scorer: importance, aggregate: sum}, threshold: 5, comparison: lte}")})
    chat(sim, scores={"importance": 1})
    assert len(sim.runs) == 1
    sim.advance(3600)
    assert len(sim.runs) == 1, "after the run nothing is pending, so lte cannot loop"
    ex = sim.explain("a.default", "user:mia")["conditions"][0]
    assert not ex["holds"] and "no pending" in ex["reason"]


def test_windowed_accumulator_counts_within_window(tmp_path):
    sim = sim_for(tmp_path, {"b": derivation(
        "b", "accumulator: {metric: count, threshold: 5, window: {size_s: 600, hop_s: 60}}")})
    for _ in range(4):
        chat(sim)
        sim.advance(240)           # spread out: never 5 within 10 minutes
    assert sim.runs == []
    for _ in range(5):
        chat(sim)
        sim.advance(10)
    assert reasons(sim) == [["trigger:b.default:threshold"]]


def test_census_counts_current_state_and_needs_fresh_data(tmp_path):
    sim = sim_for(tmp_path, {"rec": derivation(
        "rec", "census: {collections: [relations], types: [contradiction], threshold: 3}",
        source="collections: [main]")})
    for _ in range(3):
        sim.write(entity="e", collection="relations", type="contradiction", content={"topic": "t"})
    assert sim.runs == [], "census scope is observational: no driving data arrived yet"
    chat(sim, entity="e")
    assert reasons(sim) == [["trigger:rec.default:census"]]
    sim.advance(60)
    assert len(sim.runs) == 1, "a standing census never re-enqueues itself after its run"
    chat(sim, entity="e")
    assert len(sim.runs) == 2


def test_census_keyed_heads_and_tombstones(tmp_path):
    sim = sim_for(tmp_path, {"rec": derivation(
        "rec", "census: {collections: [profiles], threshold: 2}", source="collections: [main]")})
    sim.write(entity="e", collection="profiles", key="a", content={"value": "1"})
    sim.write(entity="e", collection="profiles", key="a", content={"value": "2"})
    chat(sim, entity="e")
    assert sim.runs == [], "two versions of one key are one current record"
    assert sim.outcomes_of(OutcomeKind.CENSUS_BELOW)[-1].detail["value"] == 1
    sim.retract(entity="e", collection="profiles", key="a")
    sim.write(entity="e", collection="profiles", key="b", content={"value": "1"})
    chat(sim, entity="e")
    assert sim.runs == [], "tombstoned heads are excluded"
    sim.write(entity="e", collection="profiles", key="c", content={"value": "1"})
    assert len(sim.runs) == 1, "the census reached 2 while driving data was pending"
    assert sim.runs[0]["records_consumed"] == 2


def test_lifecycle_first_record_and_total_records(tmp_path):
    sim = sim_for(tmp_path, {
        "boot": derivation("boot", "lifecycle: {first_record: true}"),
        "compact": derivation("compact", "lifecycle: {total_records: 3}"),
    })
    chat(sim)
    assert [r["derivation"] for r in sim.runs] == ["boot"]
    chat(sim)
    assert [r["derivation"] for r in sim.runs] == ["boot"]
    chat(sim)
    assert [r["derivation"] for r in sim.runs] == ["boot", "compact"]
    sim.advance(10)
    assert len(sim.runs) == 2, "neither re-fires after its own run without new records"
    chat(sim)
    assert [r["derivation"] for r in sim.runs] == ["boot", "compact", "compact"]
