"""Normalization: names, versions, inherited scopes, filled defaults, typed predicates,
semantic hashes, and the JSON form."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.catalog.helpers import (
    BASE,
    MAIN,
    D,
    assert_ok,
    build,
    merged,
    standalone,
    with_trigger,
    write_catalog,
)
from wakeline.catalog import (
    AccumulatorCondition,
    AtCondition,
    Catalog,
    CensusCondition,
    ChangedCondition,
    CronCondition,
    QuietCondition,
    WriteCondition,
    compile_catalog,
)
from wakeline.catalog._values import MISSING


def compiled(tmp_path: Path, overrides: dict[str, Any] | None = None) -> Catalog:
    result = build(tmp_path, overrides)
    assert_ok(result)
    assert result.catalog is not None
    return result.catalog


def test_inline_trigger_is_named_derivation_default(tmp_path: Path) -> None:
    cat = compiled(tmp_path, {
        **with_trigger({"write": {}, "cooldown_s": 60}),
        **standalone("d.nightly", {"cron": {"expr": "0 3 * * *"}}),
    })
    inline = cat.triggers["d.default"]
    assert (inline.derivation, inline.origin, inline.file) == ("d", "inline", "derivations/d.yaml")
    assert inline.cooldown_s == 60
    nightly = cat.triggers["d.nightly"]
    assert (nightly.origin, nightly.file) == ("standalone", "triggers/d.nightly.yaml")
    assert [t.name for t in cat.triggers_for("d")] == ["d.default", "d.nightly"]
    assert cat.triggers_for("p") == ()


def test_omitted_versions_resolve_to_the_active_version(tmp_path: Path) -> None:
    cat = compiled(tmp_path)
    assert cat.collections["main"].active_version == 2  # the highest by default
    assert [str(r) for r in cat.derivations["d"].source.collections] == ["main@2"]
    pinned = compiled(tmp_path / "pinned", {
        "collections/main.yaml": merged(MAIN, active_version=1),
        "derivations/d.yaml": merged(D, trigger={"read": True}),
    })
    assert [str(r) for r in pinned.derivations["d"].source.collections] == ["main@1"]
    explicit = compiled(tmp_path / "explicit", {"derivations/d.yaml": merged(
        D, source={"collections": ["main@1", "main"]},
        trigger={"write": {"collections": ["main@1"]}})})
    src = explicit.derivations["d"].source
    assert [str(r) for r in src.collections] == ["main@1", "main@2"]
    write = explicit.triggers["d.default"].conditions[0]
    assert isinstance(write, WriteCondition)
    assert [str(r) for r in write.scope.collections] == ["main@1"]


def test_consuming_scope_inherits_the_driving_source(tmp_path: Path) -> None:
    cat = compiled(tmp_path, with_trigger({"write": {},
                                           "quiet": {"types": ["chat"], "after_s": 60}}))
    t = cat.triggers["d.default"]
    write, quiet = t.conditions
    assert isinstance(write, WriteCondition) and isinstance(quiet, QuietCondition)
    assert [str(r) for r in write.scope.collections] == ["main@2"]
    assert write.scope.types == ("chat", "observation")
    assert write.scope.statuses == ("active",)
    assert write.scope.keyed is False
    assert quiet.scope.types == ("chat",)          # given
    assert quiet.scope.statuses == ("active",)     # inherited part by part


def test_observational_scope_inherits_only_when_collections_omitted(tmp_path: Path) -> None:
    cat = compiled(tmp_path, with_trigger({
        "census": {"collections": ["notes"], "threshold": 2},
        "at": {"field": "when", "offset_s": -60},
    }))
    census, at = cat.triggers["d.default"].conditions
    assert isinstance(census, CensusCondition) and isinstance(at, AtCondition)
    assert [str(r) for r in census.scope.collections] == ["notes@1"]
    assert census.scope.types is None and census.scope.statuses is None  # any
    assert [str(r) for r in at.scope.collections] == ["main@2"]
    assert at.scope.types == ("chat", "observation")                     # whole source scope
    assert at.field.type == "datetime" and at.offset_s == -60


def test_defaults_are_filled(tmp_path: Path) -> None:
    cat = compiled(tmp_path, {
        **with_trigger({"cron": {"expr": "0  3 * * *"},
                        "accumulator": {"metric": "count", "threshold": 5,
                                        "window": {"size_s": 600}}}),
        "derivations/p.yaml": merged(BASE["derivations/p.yaml"], trigger={"changed": {}}),
    })
    acc, cron = cat.triggers["d.default"].conditions
    assert isinstance(cron, CronCondition)
    assert (cron.expr, cron.entities) == ("0 3 * * *", "dirty")  # whitespace normalized
    assert isinstance(acc, AccumulatorCondition)
    assert (acc.comparison, acc.metric.kind, acc.metric.aggregate) == ("gte", "count", "count")
    assert acc.window is not None and (acc.window.size_s, acc.window.hop_s) == (600, 60)
    assert acc.scope == cat.derivations["d"].source.scope  # the accumulator scope IS the source
    assert acc.reason == "threshold"
    (changed,) = cat.triggers["p.default"].conditions
    assert isinstance(changed, ChangedCondition)
    assert changed.transitions == ("added", "changed", "removed")
    assert changed.keys is None and changed.scope.keyed is True
    d = cat.derivations["d"]
    assert (d.source.mode, d.source.allow_empty, d.timeout_s) == ("changes", False, 300)


def test_metric_forms(tmp_path: Path) -> None:
    def metric(m: Any) -> Any:
        cat = compiled(tmp_path / str(abs(hash(json.dumps(m)))),
                       with_trigger({"accumulator": {"metric": m, "threshold": 3}}))
        cond = cat.triggers["d.default"].conditions[0]
        assert isinstance(cond, AccumulatorCondition)
        return cond.metric.model_dump()

    assert metric("importance") == {"kind": "scorer", "aggregate": "sum", "scorer": "importance",
                                    "annotator": None, "path": None}
    assert metric({"scorer": "importance", "aggregate": "max"})["aggregate"] == "max"
    assert metric({"annotation": "sentiment_v1", "path": "valence", "aggregate": "avg"}) == {
        "kind": "annotation", "aggregate": "avg", "scorer": None, "annotator": "sentiment_v1",
        "path": "valence"}


def test_debounced_marks_data_conditions_only(tmp_path: Path) -> None:
    cat = compiled(tmp_path, with_trigger({
        "write": {}, "cron": {"expr": "@daily"}, "read": True, "debounce_s": 30}))
    t = cat.triggers["d.default"]
    assert {c.kind: getattr(c, "debounced", None) for c in t.conditions} == {
        "write": True, "cron": None, "read": None}
    assert t.kinds == ("write", "cron", "read")
    assert t.reason_key("write") == "trigger:d.default:write"
    assert t.reason_key(t.conditions[1]) == "trigger:d.default:cron"


def test_where_predicates_are_typed_with_bindings(tmp_path: Path) -> None:
    cat = compiled(tmp_path, with_trigger({"write": {"where": {
        "valence": {"lte": -0.5},
        "nested": {"eq": "x"},
        "tags": {"contains_any": ["b", "a", "b"]},
        "when": {"gte": "2026-01-01T02:00:00+02:00"},
    }}}))
    (write,) = cat.triggers["d.default"].conditions
    preds = {(p.field.name, p.op): p for p in write.scope.where}
    val = preds[("valence", "lte")]
    assert (val.field.type, val.value) == ("number", -0.5)
    (b,) = val.field.bindings
    assert (b.collection, b.version, b.backing, b.annotator, b.path) == (
        "main", 2, "annotation", "sentiment_v1", "valence")
    assert preds[("nested", "eq")].field.bindings[0].path == "a.b"
    assert preds[("tags", "contains_any")].value == ["a", "b"]        # a set: sorted, deduped
    assert preds[("when", "gte")].value == "2026-01-01T00:00:00Z"     # canonical UTC


def _record(**kw: Any) -> dict[str, Any]:
    base = {"collection": "main", "collection_version": 2, "type": "chat", "status": "active",
            "content": {}, "annotations": {}, "scores": {}}
    return {**base, **kw}


def test_scope_matches_records(tmp_path: Path) -> None:
    cat = compiled(tmp_path, with_trigger({"write": {"types": ["chat"], "where": {
        "valence": {"lte": -0.5},
        "tags": {"contains_all": ["a", "b"]},
        "when": {"gte": "2026-01-01T00:00:00Z"},
        "count": {"in": [1, 2]},
        "session_id": {"exists": False},
    }}}))
    scope = cat.triggers["d.default"].conditions[0].scope  # type: ignore[union-attr]
    good = _record(content={"tags": ["b", "a", "c"], "when": "2026-01-01T01:00:00+01:00",
                            "count": 2},
                   annotations={"sentiment_v1": {"valence": -0.7}})
    assert scope.matches(good)
    assert not scope.matches({**good, "type": "observation"})
    assert not scope.matches({**good, "status": "archived"})
    assert not scope.matches({**good, "collection_version": 1})
    assert not scope.matches({**good, "annotations": {"sentiment_v1": {"valence": 0.1}}})
    assert not scope.matches({**good, "annotations": {}})
    assert not scope.matches({**good, "content": {**good["content"], "tags": ["a"]}})
    assert not scope.matches({**good, "content": {**good["content"],
                                                  "when": "2025-12-31T23:59:59Z"}})
    assert not scope.matches({**good, "content": {**good["content"], "session_id": "s"}})
    assert not scope.matches({**good, "content": {**good["content"], "count": "2"}})


def test_field_and_metric_lookup() -> None:
    from wakeline.catalog import FieldBinding, Metric

    b = FieldBinding(collection="main", version=2, backing="content", path="a.b")
    assert b.lookup({"content": {"a": {"b": 3}}}) == 3
    assert b.lookup({"content": {"a": 1}}) is MISSING
    m = Metric(kind="scorer", aggregate="sum", scorer="importance")
    assert m.lookup({"scores": {"importance": 4.5}}) == 4.5
    assert m.lookup({"scores": {}}) is MISSING
    assert Metric(kind="count", aggregate="count").lookup({}) == 1


CANONICAL = """\
name: d
function: mod:fn
source:
  collections: [main]
  types: [chat, observation]
  statuses: [active]
emits: [out]
trigger:
  write:
    types: [chat, observation]
    where:
      tags: {contains_any: [a, b]}
      score: {gte: 0.5}
  cooldown_s: 60
"""

REWRITTEN = """\
# the same trigger, reformatted: comments, key order, flow vs block, list order
trigger:
  cooldown_s: 60       # pacing first this time
  write:
    where:
      score:
        gte: 0.5
      tags:
        contains_any:
          - b
          - a
    types: [observation, chat]
emits:
  - out
source: {statuses: [active], collections: [main], types: [observation, chat]}
function: "mod:fn"
description: a comment-like description is not semantic
name: d
"""


def _hashes(root: Path, text: str) -> tuple[str, str, str]:
    write_catalog(root, {**BASE, "derivations/d.yaml": text})
    cat = compile_catalog(root)
    return cat.triggers["d.default"].hash, cat.derivations["d"].hash, cat.hash


def test_hash_is_stable_under_formatting(tmp_path: Path) -> None:
    a = _hashes(tmp_path / "a", CANONICAL)
    b = _hashes(tmp_path / "b", REWRITTEN)
    assert a == b
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", a[0])


@pytest.mark.parametrize("edit, changes", [
    (("cooldown_s: 60", "cooldown_s: 61"), "trigger"),
    (("score: {gte: 0.5}", "score: {gt: 0.5}"), "trigger"),
    (("tags: {contains_any: [a, b]}", "tags: {contains_any: [a, c]}"), "trigger"),
    (("    types: [chat, observation]\n    where", "    types: [chat]\n    where"), "trigger"),
    (("function: mod:fn", "function: mod:other"), "derivation"),
])
def test_hash_changes_with_semantics(tmp_path: Path, edit: tuple[str, str], changes: str) -> None:
    before = _hashes(tmp_path / "a", CANONICAL)
    assert edit[0] in CANONICAL
    after = _hashes(tmp_path / "b", CANONICAL.replace(*edit))
    trigger_changed, derivation_changed = before[0] != after[0], before[1] != after[1]
    assert (trigger_changed, derivation_changed) == (changes == "trigger", changes == "derivation")
    assert before[2] != after[2]  # the catalog hash covers everything


def test_hash_follows_the_resolved_collection_version(tmp_path: Path) -> None:
    """Bumping the active version re-scopes the trigger, so its hash changes."""
    text = CANONICAL.replace("      score: {gte: 0.5}\n", "")  # score exists only in v2
    v1 = _hashes(tmp_path / "a", text)
    write_catalog(tmp_path / "b", {**BASE, "derivations/d.yaml": text,
                                   "collections/main.yaml": merged(MAIN, active_version=1)})
    cat = compile_catalog(tmp_path / "b")
    assert cat.triggers["d.default"].hash != v1[0]


def test_collection_hash_ignores_descriptions(tmp_path: Path) -> None:
    a = compiled(tmp_path / "a")
    b = compiled(tmp_path / "b", {"collections/main.yaml": merged(MAIN, description="changed")})
    c = compiled(tmp_path / "c", {"collections/main.yaml": merged(MAIN, scorers=["importance",
                                                                                "urgency"])})
    assert a.collections["main"].hash == b.collections["main"].hash
    assert a.collections["main"].hash != c.collections["main"].hash


def test_to_json_lists_every_trigger_condition_and_hash(tmp_path: Path) -> None:
    cat = compiled(tmp_path, {
        **with_trigger({"write": {}, "read": True}),
        **standalone("d.nightly", {"cron": {"expr": "0 3 * * *", "entities": "any"}}),
    })
    data = json.loads(cat.to_json())
    assert list(data["triggers"]) == ["d.default", "d.nightly"]
    default = data["triggers"]["d.default"]
    assert [c["kind"] for c in default["conditions"]] == ["write", "read"]
    assert default["hash"] == cat.triggers["d.default"].hash
    assert data["triggers"]["d.nightly"]["conditions"][0] == {
        "kind": "cron", "reason": "cron", "expr": "0 3 * * *", "entities": "any",
        "yaml_path": "cron"}
    assert set(data) >= {"hash", "collections", "derivations", "triggers"}
    assert Catalog.from_json(cat.to_json()) == cat


def test_catalog_hash_is_independent_of_location(tmp_path: Path) -> None:
    assert compiled(tmp_path / "a").hash == compiled(tmp_path / "elsewhere").hash
