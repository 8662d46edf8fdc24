"""The shipped example catalog compiles, uses every condition kind, has no cycle, and
its derivation callables honour the contract."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from wakeline.catalog import (
    Catalog,
    CatalogInvalid,
    DerivationContext,
    InvalidEmission,
    check_catalog,
    compile_catalog,
    validate_emissions,
)
from wakeline.catalog._graph import edges
from wakeline.catalog.schema import CONDITION_KINDS

EXAMPLE = Path(__file__).resolve().parents[3] / "catalog"
NOW = datetime(2026, 7, 19, 9, 15, tzinfo=UTC)


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return compile_catalog(EXAMPLE, resolve_functions=True)


def test_compiles_cleanly_without_warnings() -> None:
    result = check_catalog(EXAMPLE, resolve_functions=True)
    assert result.issues == [] and result.warnings == []


def test_uses_every_condition_kind(cat: Catalog) -> None:
    used = {k for t in cat.triggers.values() for k in t.kinds}
    assert used == set(CONDITION_KINDS)


def test_the_seed_scenarios(cat: Catalog) -> None:
    t = cat.triggers
    quiet = t["session_summary.default"].condition("quiet")
    assert quiet is not None and quiet.after_s == 900  # type: ignore[union-attr]
    assert t["profile.default"].kinds == ("read",) and t["profile.default"].cooldown_s == 60
    cron = t["profile.nightly"].condition("cron")
    assert cron is not None and cron.expr == "0 3 * * *"  # type: ignore[union-attr]
    assert t["profile.nightly"].origin == "standalone"
    lifecycle = t["profile.bootstrap"].condition("lifecycle")
    assert lifecycle is not None and lifecycle.first_record  # type: ignore[union-attr]
    acc = t["reflection.default"].condition("accumulator")
    assert acc is not None and acc.threshold == 100  # type: ignore[union-attr]
    assert acc.metric.scorer == "importance" and t["reflection.default"].cooldown_s  # type: ignore[union-attr]
    burst = t["reflection.burst"].condition("accumulator")
    assert burst is not None and burst.window is not None  # type: ignore[union-attr]
    census = t["reconcile.default"].condition("census")
    assert census is not None and census.threshold == 3  # type: ignore[union-attr]
    assert census.scope.types == ("contradiction",)  # type: ignore[union-attr]
    at = t["reminders.default"].condition("at")
    assert at is not None and (at.field.name, at.offset_s) == ("starts_at", -3600)  # type: ignore[union-attr]
    assert cat.derivations["reminders"].source.mode in ("snapshot", "current", "view")
    changed = t["skills.default"].condition("changed")
    assert changed is not None and changed.keys == ("commitments", "role")  # type: ignore[union-attr]
    assert t["profile_repair.default"].kinds == ("retraction",)
    write = t["contradiction_detect.default"].condition("write")
    assert write is not None and write.scope.where and write.debounced  # type: ignore[union-attr]
    assert cat.collections["profiles"].keyed and not cat.collections["main"].keyed
    assert cat.collections["main"].annotators["sentiment_v1"].required


def test_dependency_chain_has_no_cycle(cat: Catalog) -> None:
    chain = {(e.source, e.target) for e in edges(cat.derivations, cat.triggers)}
    assert chain == {
        ("contradiction_detect", "reconcile"),
        ("profile", "skills"), ("profile", "profile_repair"),
        ("reconcile", "skills"), ("reconcile", "profile_repair"),
    }


def test_feeding_skills_back_into_profiles_is_a_cycle(tmp_path: Path) -> None:
    root = tmp_path / "catalog"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    doc = yaml.safe_load((root / "derivations/skills.yaml").read_text())
    doc["emits"] = ["skills", "profiles"]
    (root / "derivations/skills.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(CatalogInvalid) as info:
        compile_catalog(root)
    assert info.value.codes == ["graph.cycle"]
    assert "skills → skills" in info.value.issues[0].message


def _rec(seq: int, collection: str, type_: str = "", *, key: str | None = None,
         content: dict[str, Any] | None = None, text: str = "", tombstone: bool = False,
         scores: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"seq": seq, "collection": collection, "collection_version": 1, "type": type_,
            "status": "active", "key": key, "content": content or {}, "text": text,
            "tombstone": tombstone, "parents": [], "annotations": {}, "scores": scores or {},
            "created_at": NOW - timedelta(minutes=60 - seq)}


SAMPLES: dict[str, list[dict[str, Any]]] = {
    "session_summary": [
        _rec(1, "main", "chat", content={"session_id": "s1", "speaker": "mia"}, text="hi there"),
        _rec(2, "main", "chat", content={"session_id": "s1", "speaker": "agent"}, text="hello"),
        _rec(3, "main", "chat", content={"session_id": "s2", "speaker": "mia"}, text="later"),
    ],
    "profile": [
        _rec(1, "main", "observation", content={"facts": {"role": "engineer"}}),
        _rec(2, "main", "chat", content={"facts": {"commitments": ["ship v2"], "shoe": 9}}),
        _rec(3, "main", "chat", content={"forget": ["timezone"]}),
    ],
    "skills": [
        _rec(1, "profiles", key="role", content={"value": "engineer"}),
        _rec(2, "profiles", key="commitments", content={"value": ["ship v2", "write docs"]}),
    ],
    "profile_repair": [_rec(5, "profiles", key="role", tombstone=True)],
    "reflection": [
        _rec(i, "main", "observation", text=f"note {i}", scores={"importance": i * 10})
        for i in range(1, 6)
    ],
    "contradiction_detect": [
        _rec(1, "main", "observation", content={"claim": {"key": "role", "value": "engineer"}}),
        _rec(2, "main", "observation", content={"claim": {"key": "role", "value": "designer"}}),
        _rec(3, "main", "observation", content={"claim": {"key": "city", "value": "Oslo"}}),
    ],
    "reconcile": [
        _rec(i, "relations", "contradiction", content={"subject": s})
        for i, s in enumerate(["role", "role", "city"], start=1)
    ],
    "reminders": [
        _rec(1, "calendar_events", key="e1", content={
            "title": "Standup", "starts_at": (NOW + timedelta(minutes=59)).isoformat()}),
        _rec(2, "calendar_events", key="e2", content={
            "title": "Offsite", "starts_at": (NOW + timedelta(days=2)).isoformat()}),
    ],
}

EXPECTED_COUNTS = {"session_summary": 2, "profile": 3, "skills": 1, "profile_repair": 1,
                   "reflection": 1, "contradiction_detect": 1, "reconcile": 3, "reminders": 1}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_callables_are_deterministic_and_honour_the_contract(cat: Catalog, name: str) -> None:
    fn = cat.load_function(name)
    ctx = DerivationContext(entity="user:mia", derivation=name, now=NOW, records=SAMPLES[name],
                            reasons=(f"trigger:{name}.default:write",))
    first = fn(ctx)
    assert fn(ctx) == first
    assert len(validate_emissions(cat, name, first)) == EXPECTED_COUNTS[name]
    assert validate_emissions(cat, name, fn(DerivationContext(
        entity="user:new", derivation=name, now=NOW))) == []


def test_every_derivation_has_a_sample(cat: Catalog) -> None:
    assert set(SAMPLES) == set(cat.derivations)


def test_profile_emits_values_and_retractions(cat: Catalog) -> None:
    fn = cat.load_function("profile")
    out = fn(DerivationContext(entity="u", derivation="profile", now=NOW,
                               records=SAMPLES["profile"]))
    assert out == [
        {"collection": "profiles", "key": "commitments",
         "content": {"value": ["ship v2"], "source_seq": 2}, "text": "commitments: ship v2"},
        {"collection": "profiles", "key": "role",
         "content": {"value": "engineer", "source_seq": 1}, "text": "role: engineer"},
        {"collection": "profiles", "key": "timezone", "retract": True},
    ]


@pytest.mark.parametrize("bad, phrase", [
    ("nope", "return a list"),
    ([{"collection": "reflections", "type": "x", "content": {}}], "not in the derivation's emits"),
    ([{"collection": "profiles", "key": "role", "content": {}}], "needs content"),
    ([{"collection": "profiles", "key": "role", "retract": True, "text": ""}], "exactly"),
    ([{"collection": "profiles", "key": "", "content": {}, "text": ""}], "non-empty key"),
    ([{"collection": "profiles", "key": "r", "content": {"tombstone": True}, "text": ""}],
     "emit retract: true"),
])
def test_validate_emissions_rejects(cat: Catalog, bad: Any, phrase: str) -> None:
    with pytest.raises(InvalidEmission) as info:
        validate_emissions(cat, "profile", bad)
    assert phrase in info.value.message


def test_validate_emissions_event_rules(cat: Catalog) -> None:
    ok = [{"collection": "reflections", "type": "reflection", "content": {}, "text": "t"}]
    assert validate_emissions(cat, "reflection", ok) == ok
    with pytest.raises(InvalidEmission, match="retract needs a keyed collection"):
        validate_emissions(cat, "reflection", [{"collection": "reflections", "key": "k",
                                                "retract": True}])
    with pytest.raises(InvalidEmission, match="has keys"):
        validate_emissions(cat, "reflection", [{"collection": "reflections", "content": {}}])
