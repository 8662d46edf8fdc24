"""explain(trigger, entity): for each condition, does it hold and why (not) — every reason."""

from __future__ import annotations

from tests.unit.core.helpers import chat, derivation, sim_for


def cond(sim, trigger, entity="user:mia", i=0):
    return sim.explain(trigger, entity)["conditions"][i]


def test_explain_threshold_value_vs_threshold(tmp_path):
    sim = sim_for(tmp_path, {"r": derivation("r", "accumulator: {metric: importance, threshold: 100}")})
    chat(sim, scores={"importance": 30})
    c = cond(sim, "r.default")
    assert c["holds"] is False and c["value"] == 30 and c["threshold"] == 100
    assert c["reason"] == "sum 30 < threshold 100"
    last = sim.explain("r.default", "user:mia")["last_outcomes"][-1]
    assert last["kind"] == "below_threshold" and last["detail"]["value"] == 30


def test_explain_no_data_above_watermark(tmp_path):
    sim = sim_for(tmp_path, {"r": derivation("r", "write: {}")})
    c = cond(sim, "r.default")
    assert not c["holds"] and c["reason"] == "no matching record above watermark 0"
    chat(sim)
    c = cond(sim, "r.default")
    assert not c["holds"] and c["reason"] == "no matching record above watermark 1"


def test_explain_cooling_and_debouncing_until(tmp_path):
    sim = sim_for(tmp_path, {
        "c": derivation("c", "write: {}\ncooldown_s: 120"),
        "d": derivation("d", "write: {}\ndebounce_s: 45"),
    })
    chat(sim)
    sim.advance(1)
    chat(sim)
    c = cond(sim, "c.default")
    assert c["holds"] and c["waiting"] == ["cooling until 2026-07-19T09:02:00Z"]
    d = cond(sim, "d.default")
    assert d["holds"] and d["waiting"] == ["debouncing until 2026-07-19T09:00:46Z"]


def test_explain_waiting_on_unready_seq(tmp_path):
    sim = sim_for(tmp_path, {"r": derivation("r", "write: {}")})
    u = chat(sim, ready=False)
    chat(sim)
    c = cond(sim, "r.default")
    assert c["holds"] and c["waiting"] == [f"waiting on unready seq {u}"]


def test_explain_census_lifecycle_changed_quiet_at_paused(tmp_path):
    sim = sim_for(tmp_path, {
        "ce": derivation("ce", "census: {collections: [relations], threshold: 2}"),
        "lc": derivation("lc", "lifecycle: {total_records: 5}"),
        "ch": derivation("ch", "changed: {}", source="collections: [profiles]"),
        "qu": derivation("qu", "quiet: {after_s: 600}"),
        "at": derivation("at", "at: {collections: [calendar], field: starts_at}",
                         source="collections: [calendar]", mode="current"),
    })
    sim.write(entity="user:mia", collection="relations", type="contradiction",
              content={"topic": "x"})
    chat(sim)
    assert cond(sim, "ce.default")["reason"] == "census 1 < threshold 2"
    assert cond(sim, "lc.default")["reason"] == "total records 1 < 5"
    q = cond(sim, "qu.default")
    assert not q["holds"] and q["reason"] == "not settled until 2026-07-19T09:10:00Z"
    sim.write(entity="user:mia", collection="profiles", key="role", content={"value": "a"})
    sim.write(entity="user:mia", collection="profiles", key="role", content={"value": "a"})
    ch = cond(sim, "ch.default")
    assert not ch["holds"]
    assert ch["reason"] == "pending keyed records do not change any head"
    sim.write(entity="user:mia", collection="calendar", key="standup",
              content={"starts_at": "2026-07-19T12:00:00Z"})
    a = cond(sim, "at.default")
    assert a["holds"] and a["reason"].startswith("scheduled for 2026-07-19T12:00:00Z")
    sim.pause("qu.default", reason="maintenance")
    assert "trigger paused" in cond(sim, "qu.default")["waiting"]


def test_explain_no_transition_after_identical_rewrite(tmp_path):
    sim = sim_for(tmp_path, {"ch": derivation("ch", "changed: {}\ncooldown_s: 3600",
                                              source="collections: [profiles]")})
    sim.write(entity="e", collection="profiles", key="role", content={"value": "a"})
    assert len(sim.runs) == 1
    sim.write(entity="e", collection="profiles", key="role", content={"value": "a"})
    c = cond(sim, "ch.default", "e")
    assert not c["holds"] and c["reason"] == "pending keyed records do not change any head"
    assert sim.explain("ch.default", "e")["last_outcomes"][-1]["kind"] == "no_transition"


def test_explain_read_and_cron_describe_their_events(tmp_path):
    sim = sim_for(tmp_path, {"p": derivation("p", "read: true\ncron: {expr: '0 3 * * *'}")})
    kinds = [c["condition"] for c in sim.explain("p.default", "x")["conditions"]]
    assert kinds == ["cron", "read"] or kinds == ["read", "cron"]
