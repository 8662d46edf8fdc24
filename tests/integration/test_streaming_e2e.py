"""End to end, with real short durations, on both stacks:

- ``embedded``: PostgreSQL → the built-in relay → Tansu → Faust agents → derive
  workers → PostgreSQL;
- ``kafka-debezium``: PostgreSQL → Debezium in Kafka Connect → Apache Kafka 4.x (KRaft)
  → the same agents and workers.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.fixtures.streaming import make_stack
from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.streams.keys import entity_key

pytestmark = pytest.mark.integration

ENRICH = """
def imp(record):
    if record["content"].get("explode"):
        raise RuntimeError("the scoring model is down")
    return 7.0

def mood(record):
    return {"valence": -0.5, "label": "sad"}
"""

SLOW = "import time\n\ndef slow(ctx):\n    time.sleep(1.5)\n    return []\n"


def stream_catalog(tmp: Path) -> Path:
    root = catalog_dir(tmp, {
        "w": derivation("w", "write: {where: {priority: {gte: 5}}}", function="simfuncs:count",
                        emits="[out]"),
        "acc": derivation("acc", "accumulator: {metric: importance, threshold: 10}"),
        "ce": derivation("ce", "census: {collections: [relations], types: [contradiction], "
                               "threshold: 2}", source="collections: [main]"),
        "ch": derivation("ch", "changed: {keys: [role]}", source="collections: [profiles]"),
        "rt": derivation("rt", "retraction: {}", source="collections: [profiles]"),
        "qu": derivation("qu", "quiet: {types: [observation], after_s: 1}",
                         source="collections: [main]"),
        "at": derivation("at", "at: {collections: [calendar], field: starts_at}",
                         source="collections: [calendar]", mode="current"),
        "cr": derivation("cr", "cron: {expr: '* * * * *', entities: dirty}",
                         source="collections: [relations]\n  types: [support]"),
        "rd": derivation("rd", "read: true", source="collections: [relations]"),
        "tri": derivation("tri", "write: {types: [chat], where: {priority: {eq: 42}}}\n"
                                 "accumulator: {metric: importance, threshold: 1}",
                          source="collections: [main]"),
        "slow": derivation("slow", "write: {}", function="slowfn:slow",
                           source="collections: [out]"),
        "cool": derivation("cool", "write: {}\ncooldown_s: 30",
                           source="collections: [outk]"),
        "er": derivation("er", "changed: {}", source="collections: [prefs]"),
        "deb": derivation("deb", "write: {}\ndebounce_s: 1", source="collections: [burst]"),
    }, triggers={"tri.boot": "name: tri.boot\nprocessor: tri\nlifecycle: {first_record: true}\n"})
    (root / "slowfn.py").write_text(SLOW)
    (root / "collections" / "prefs.yaml").write_text(
        "name: prefs\nkeyed: true\nfields:\n  value: string\n")
    (root / "collections" / "burst.yaml").write_text(
        "name: burst\nkeyed: false\nfields:\n  n: integer\n")
    main = (root / "collections" / "main.yaml").read_text()
    (root / "collections" / "main.yaml").write_text(main.replace(
        "scorers: [importance]",
        "scorers: [importance]\nenrichers: {importance: enrichfns:imp, mood_v1: enrichfns:mood}"))
    (root / "enrichfns.py").write_text(ENRICH)
    return root


@pytest.fixture(scope="module", params=["embedded", "kafka-debezium"])
def stack(request, pg_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stream")
    if request.param == "embedded":
        broker = request.getfixturevalue("tansu_broker")
        st = make_stack(pg_server, tmp, broker.bootstrap, stream_catalog(tmp))
    else:
        broker = request.getfixturevalue("kafka_broker")
        st = make_stack(pg_server, tmp, broker.bootstrap, stream_catalog(tmp), cdc="debezium",
                        connect=request.getfixturevalue("kafka_connect"))
    worker = st.worker(relay=request.param == "embedded", env={"WAKELINE_STATS_INTERVAL": "0.5"})
    worker.wait_for("conditions ready", timeout=90)
    yield st
    st.stop()
    st.store.close()


def reasons_of(runs):
    return [r["trigger_reasons"] for r in runs]


def test_each_condition_kind_fires_end_to_end(stack):
    st = stack
    t0 = time.monotonic()
    st.write("e:cron", "relations", type="support", content={"topic": "t"})   # cron: dirty
    st.write("e:write", type="chat", content={"priority": 7})
    for _ in range(2):
        st.write("e:acc", type="chat", content={"priority": 1}, scores={"importance": 6})
    st.write("e:census", "relations", type="contradiction", content={"topic": "a"})
    st.write("e:census", "relations", type="contradiction", content={"topic": "b"})
    st.write("e:census", type="chat", content={})
    st.write("e:ch", "profiles", key="role", content={"value": "engineer"})
    st.write("e:ch", "profiles", key="role", content={"value": "engineer"})  # identical
    st.write("e:rt", "profiles", key="role", content={"value": "x"})
    st.store.retract("default", "e:rt", "profiles", "role")
    st.write("e:quiet", type="observation", content={})
    soon = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
    st.write("e:at", "calendar", key="standup", content={"starts_at": soon})
    st.write("e:read", "relations", type="support", content={})
    st.send_stimulus("e:read", "read", max_staleness=0)  # never ran: stale

    def one(derivation, entity, timeout=30):
        runs = st.wait_runs(1, timeout=timeout, derivation=derivation, entity=entity)
        assert runs, f"{derivation} never ran for {entity}:\n" + "\n".join(
            st.workers[0].lines[-40:]) + f"\n{st.query('SELECT * FROM cron_buckets')}"
        return runs

    assert reasons_of(one("w", "e:write")) == [["trigger:w.default:write"]]
    assert reasons_of(one("acc", "e:acc")) == [["trigger:acc.default:threshold"]]
    assert reasons_of(one("ce", "e:census")) == [["trigger:ce.default:census"]]
    ch = one("ch", "e:ch")
    time.sleep(1)
    assert reasons_of(st.runs("ch", "e:ch")) == [["trigger:ch.default:changed"]], \
        "the identical rewrite does not fire"
    assert ["trigger:rt.default:retraction"] in reasons_of(one("rt", "e:rt"))
    quiet = one("qu", "e:quiet")
    assert reasons_of(quiet) == [["trigger:qu.default:quiet"]]
    at = one("at", "e:at")
    assert reasons_of(at) == [["trigger:at.default:at"]]
    assert at[0]["finished_at"] >= datetime.fromisoformat(soon)
    assert reasons_of(one("rd", "e:read")) == [["trigger:rd.default:read"]]
    lifecycle = one("tri", "e:write")
    assert "trigger:tri.boot:lifecycle" in lifecycle[0]["trigger_reasons"]
    cron = one("cr", "e:cron", timeout=max(5, 70 - (time.monotonic() - t0)))
    assert reasons_of(cron) == [["trigger:cr.default:cron"]]
    assert ch[0]["outcome"] == "succeeded"


def test_three_triggers_firing_together_make_one_run(stack):
    st = stack
    st.write("e:tri", type="chat", content={"priority": 42}, scores={"importance": 5})
    runs = st.wait_runs(1, derivation="tri", entity="e:tri")
    time.sleep(1.0)
    runs = st.runs("tri", "e:tri")
    assert reasons_of(runs) == [["trigger:tri.boot:lifecycle", "trigger:tri.default:threshold",
                                 "trigger:tri.default:write"]]


def test_records_arriving_during_a_run_make_exactly_one_successor(stack):
    st = stack
    st.write("e:slow", "out", type="x", content={"n": 1})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # wait until the slow run is running
        if st.query("SELECT 1 FROM jobs WHERE derivation = 'slow' AND entity = 'e:slow' "
                    "AND state = 'running'"):
            break
        time.sleep(0.05)
    for i in range(5):
        st.write("e:slow", "out", type="x", content={"n": i})
    runs = st.wait_runs(2, derivation="slow", entity="e:slow")
    time.sleep(3)
    runs = st.runs("slow", "e:slow")
    assert [r["records_consumed"] for r in runs] == [1, 5], runs


def test_cooldown_holds_and_a_manual_run_bypasses_it(stack):
    st = stack
    st.write("e:cool", "outk", key="a", content={"n": 1})
    st.wait_runs(1, derivation="cool", entity="e:cool")
    st.write("e:cool", "outk", key="a", content={"n": 2})
    time.sleep(2)
    assert len(st.runs("cool", "e:cool")) == 1, "cooling for 30 s"
    cooldown = st.query("SELECT reason FROM outcomes WHERE derivation = 'cool' "
                        "AND entity = 'e:cool' AND kind = 'cooldown'")
    assert cooldown and cooldown[0][0].startswith("cooling until")
    st.send_stimulus("e:cool", "manual", derivation="cool")
    runs = st.wait_runs(2, derivation="cool", entity="e:cool", timeout=20)
    assert reasons_of(runs)[1] == ["manual", "trigger:cool.default:write"]


def test_debounce_settles_a_burst_into_one_run(stack):
    st = stack
    for n in range(5):
        st.write("e:deb", "burst", content={"n": n})
        time.sleep(0.1)
    runs = st.wait_runs(1, derivation="deb", entity="e:deb", timeout=30)
    time.sleep(2.5)  # past another debounce window: nothing more may run
    runs = st.runs("deb", "e:deb")
    assert len(runs) == 1, runs
    assert runs[0]["records_consumed"] == 5
    assert reasons_of(runs) == [["trigger:deb.default:write"]]
    held = st.query("SELECT reason FROM outcomes WHERE derivation = 'deb' "
                    "AND entity = 'e:deb' AND kind = 'debounce'")
    assert held and held[0][0].startswith("debouncing until"), held


def test_malformed_change_goes_to_dead_letter_and_the_stream_goes_on(stack):
    st = stack
    topo = __import__("yaml").safe_load(st.topology.read_text())
    p = Producer({"bootstrap.servers": st.bootstrap, "partitioner": "murmur2_random"})
    p.produce(topo["topics"]["changes"]["name"], key=entity_key("default", "e:dlq"),
              value=b"{not json")
    assert p.flush(10) == 0
    st.write("e:dlq", type="chat", content={"priority": 9})
    assert st.wait_runs(1, derivation="w", entity="e:dlq")
    from wakeline.cdc.dlq import read_dead_letters
    letters = read_dead_letters(st.bootstrap, topo["topics"]["dead_letter"]["name"],
                                timeout=20, expect=1)
    assert [(d.value, d.code) for d in letters] == [(b"{not json", "cdc.envelope.not_json")]
    assert letters[0].topic == topo["topics"]["changes"]["name"]
    outcome = st.query("SELECT reason FROM outcomes WHERE kind = 'dead_letter' "
                       "AND entity = 'e:dlq'")
    assert outcome and outcome[0][0].startswith("cdc.envelope.not_json")


def test_a_message_on_the_derive_topic_that_is_not_a_job_is_dead_lettered(stack):
    """The derive consumer dead-letters what it cannot read as a job, records the
    outcome, and runs the jobs after it."""
    from wakeline.cdc.dlq import read_dead_letters
    from wakeline.derive import JobSpec

    st = stack
    topo = __import__("yaml").safe_load(st.topology.read_text())
    derive_topic = topo["topics"]["derive"]["name"]
    key = entity_key("default", "e:badjob")
    p = Producer({"bootstrap.servers": st.bootstrap, "partitioner": "murmur2_random"})
    p.produce(derive_topic, key=key, value=b'{"job_id": 7}')
    p.produce(derive_topic, key=key, value=JobSpec(
        "default/w/e:badjob/manual-1", "default", "w", "e:badjob", ("manual",)).to_json())
    assert p.flush(10) == 0
    runs = st.wait_runs(1, derivation="w", entity="e:badjob", timeout=30)
    assert [r["job_id"] for r in runs] == ["default/w/e:badjob/manual-1"]
    letters = [d for d in read_dead_letters(st.bootstrap, topo["topics"]["dead_letter"]["name"],
                                            timeout=20, expect=2)
               if d.topic == derive_topic]
    assert [(d.value, d.code) for d in letters] == [(b'{"job_id": 7}', "derive.job.malformed")]
    outcome = st.query("SELECT reason FROM outcomes WHERE kind = 'dead_letter' "
                       "AND entity = 'e:badjob'")
    assert outcome and outcome[0][0].startswith("derive.job.malformed: not a derive job: "
                                                "KeyError"), outcome


def test_readiness_agent_enriches_unready_records_in_one_update(stack):
    st = stack
    seq = st.write("e:enrich", type="chat", content={"priority": 7}, ready=False)
    runs = st.wait_runs(1, derivation="w", entity="e:enrich", timeout=30)
    assert reasons_of(runs) == [["trigger:w.default:write"]], "\n".join(st.workers[0].lines[-30:])
    [(scores, annotations, ready)] = st.query(
        "SELECT scores, annotations, enriched_at IS NOT NULL FROM records WHERE seq = %s", seq)
    assert ready and scores == {"importance": 7.0}
    assert annotations == {"mood_v1": {"valence": -0.5, "label": "sad"}}
    st.write("e:enrich", type="chat", content={"priority": 1}, ready=False)
    acc = st.wait_runs(1, derivation="acc", entity="e:enrich", timeout=30)
    assert reasons_of(acc) == [["trigger:acc.default:threshold"]], "7 + 7 >= 10 once both are ready"


def test_failing_enricher_is_a_recorded_outcome(stack):
    st = stack
    seq = st.write("e:broken", type="chat", content={"explode": True}, ready=False)
    deadline = time.monotonic() + 30
    rows = []
    while time.monotonic() < deadline and not rows:
        rows = st.query("SELECT reason, detail FROM outcomes WHERE entity = 'e:broken' "
                        "AND kind = 'enrichment_failed'")
        time.sleep(0.2)
    assert rows and "the scoring model is down" in rows[0][0]
    assert rows[0][1]["seq"] == seq
    assert st.query("SELECT enriched_at FROM records WHERE seq = %s", seq) == [(None,)]


def test_erasure_restores_a_prior_head_the_conditions_state_had_forgotten(stack):
    """Seed: "erasure restores prior heads without writing new rows".  Once both
    versions are consumed the conditions state keeps only the head; erasing it makes
    the worker read the prior head back from PostgreSQL, so rewriting the prior value
    is no transition (without the restore it would look 'added' and run)."""
    st = stack
    st.write("e:erase", "prefs", key="tone", content={"value": "warm"})
    st.wait_runs(1, derivation="er", entity="e:erase")
    newer = st.write("e:erase", "prefs", key="tone", content={"value": "dry"})
    st.wait_runs(2, derivation="er", entity="e:erase")
    st.query("DELETE FROM records WHERE seq = %s RETURNING seq", newer)   # erasure
    again = st.write("e:erase", "prefs", key="tone", content={"value": "warm"})
    deadline = time.monotonic() + 30
    rows = []
    while time.monotonic() < deadline and not rows:
        rows = st.query("SELECT reason, detail FROM outcomes WHERE derivation = 'er' "
                        "AND entity = 'e:erase' AND kind = 'no_transition'")
        time.sleep(0.2)
    assert rows, "\n".join(st.workers[0].lines[-30:])
    time.sleep(1)
    runs = st.runs("er", "e:erase")
    assert [r["records_consumed"] for r in runs] == [1, 1], runs
    assert again > newer


def test_the_agent_takes_the_readiness_stages_batches_without_decoding_them(stack):
    """One process runs both roles: the agent gets the Items of the ready batches its
    readiness thread wrote (ready.Handoff) instead of decoding them again, and the
    runs are the ones decoding gives (every other test here runs through it too)."""
    st = stack
    st.write("e:handoff", type="chat", content={"priority": 7})
    assert st.wait_runs(1, derivation="w", entity="e:handoff")

    def handoff() -> dict[str, int]:
        lines = [ln for ln in st.workers[0].lines if ln.startswith("wakeline-stats ")]
        return json.loads(lines[-1].split(" ", 1)[1])["handoff"] if lines else {}

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not handoff().get("taken"):
        time.sleep(0.2)
    got = handoff()
    assert got.get("taken", 0) >= 1 and got["taken"] <= got["kept"], got
