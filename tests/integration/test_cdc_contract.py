"""The contract: Debezium and the relay put the SAME change stream on the topic.

One workload on the session database (``debezium`` fixture) is captured three
ways at once: real Debezium 3.4.3 → Apache Kafka, the relay → Apache Kafka and
the relay → Tansu (each relay on its own slot).  Per key (workspace, entity)
the three streams must be equal after parsing with the one envelope module,
in the same order, on the same partition, with byte-identical keys; the raw
envelopes must agree on every field except the ones that legitimately differ
(connector version, ``source.sequence`` — connector state — and the top-level
write time).  A readiness transition that rolls back never appears.
"""

from __future__ import annotations

import json
import random
import secrets
import threading
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from tests.fixtures.cdc import (
    DebeziumSession,
    Msg,
    drain_relay,
    key_of,
    read_workspace,
    write_markers,
)
from wakeline.cdc import CursorAdvance, ReadyRecord, RecordUpdate, Relay, UnreadyInsert, parse
from wakeline.cdc.envelope import RecordEvent
from wakeline.cdc.partitioner import partition_for
from wakeline.store import Store
from wakeline.store.records import NewRecord

pytestmark = pytest.mark.integration

# Entities with characters JSON must escape or write raw: quotes, backslash, a
# control character (Jackson writes \u001F upper-case), non-ASCII, emoji.
ENTITIES = ["user:mia", "user:o'neil", 'user:"quoted"', "user:back\\slash", "user:\x1fctl",
            "user:élodie", "user:☃", "team:🚀"]


def _upsert_cursor(conn: psycopg.Connection[Any], ws: str, derivation: str, entity: str,
                   watermark: int, outcome: str) -> None:
    conn.execute(
        "INSERT INTO derivation_cursors AS c (workspace, derivation, entity, watermark, "
        "last_run_at, last_success_at, at_handled_through, advance_count, last_outcome, "
        "last_job_id) VALUES (%s,%s,%s,%s, now(), now(), now(), 1, %s, %s) "
        "ON CONFLICT (workspace, derivation, entity) DO UPDATE SET watermark = "
        "excluded.watermark, last_run_at = now(), last_success_at = CASE WHEN "
        "excluded.last_outcome = 'succeeded' THEN now() ELSE c.last_success_at END, "
        "advance_count = c.advance_count + 1, last_outcome = excluded.last_outcome, "
        "last_job_id = excluded.last_job_id, updated_at = now()",
        (ws, derivation, entity, watermark, outcome, f"job-{secrets.token_hex(3)}"))


def run_workload(dsn: str, ws: str, seed: int) -> dict[str, Any]:
    """Every kind of change the engine writes, in a random but seeded order."""
    rng = random.Random(seed)
    store = Store.connect(dsn)
    facts: dict[str, Any] = {}
    try:
        unready: list[int] = []
        keyed: dict[tuple[str, str], bool] = {}
        # A record whose readiness only ever happens in a rolled-back transaction.
        never = store.insert_record(workspace=ws, entity=ENTITIES[0], collection="main",
                                    content={"what": "rolled back readiness"}, text="x")
        facts["never_ready"] = never
        # A TOASTed row (unchanged TOAST in the readiness UPDATE must be filled).
        big = "".join(rng.choice("abcdef0123456789") for _ in range(40_000))
        unready.append(store.insert_record(workspace=ws, entity=ENTITIES[1],
                                           collection="main", content={"big": big}, text=big))
        for step in range(70):
            kind = rng.choice(["insert", "insert", "multi", "ready", "ready", "keyed",
                               "retract", "cursor", "interleave", "update"])
            entity = rng.choice(ENTITIES)
            if kind == "insert":
                ready = rng.random() < 0.4
                seq = store.insert_record(NewRecord(
                    workspace=ws, entity=entity, collection="main", type=rng.choice(["chat", ""]),
                    content={"i": step, "nested": {"a": [1, 2.5, None, True]}, "s": "é\x01"},
                    text=f"t{step}\x01", ready=ready, scores={"importance": rng.randint(0, 9)}))
                if not ready:
                    unready.append(seq)
            elif kind == "multi":
                recs = [NewRecord(workspace=ws, entity=rng.choice(ENTITIES), collection="main",
                                  content={"m": step, "j": j}, ready=rng.random() < 0.5)
                        for j in range(rng.randint(2, 5))]
                for rec, seq in zip(recs, store.insert_records(recs), strict=True):
                    if not rec.ready:
                        unready.append(seq)
            elif kind == "ready" and unready:
                rng.shuffle(unready)
                take, unready = unready[: rng.randint(1, 3)], unready[3:]
                store.mark_ready(take, annotations={s: {"sentiment_v1": {"valence": 0.5}}
                                                    for s in take},
                                 scores={s: {"importance": 5} for s in take})
            elif kind == "keyed":
                k = rng.choice(["name", "city"])
                store.insert_record(NewRecord(workspace=ws, entity=entity, collection="profile",
                                              key=k, content={"v": f"{k}-{step}"}, ready=True))
                keyed[(entity, k)] = True
            elif kind == "retract":
                live = [ek for ek, alive in keyed.items() if alive]
                if live:
                    e, k = rng.choice(live)
                    store.retract(ws, e, "profile", k)
                    keyed[(e, k)] = False
            elif kind == "cursor":
                with store.conn.transaction():
                    _upsert_cursor(store.conn, ws, rng.choice(["summary", "digest"]), entity,
                                   step, rng.choice(["succeeded", "noop", "dead"]))
            elif kind == "interleave":
                # A began first and commits last: change LSNs are not commit order.
                with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
                    a.execute("INSERT INTO records (workspace, entity, collection, text) "
                              "VALUES (%s, %s, 'main', 'A1')", (ws, entity))
                    b.execute("INSERT INTO records (workspace, entity, collection, text, "
                              "enriched_at) VALUES (%s, %s, 'main', 'B1', now())", (ws, entity))
                    a.execute("INSERT INTO records (workspace, entity, collection, text, "
                              "enriched_at) VALUES (%s, %s, 'main', 'A2', now())", (ws, entity))
                    b.commit()
                    a.commit()
            elif kind == "update":
                # A ready row edited in place (status: what `at` re-arming watches).
                store.conn.execute(
                    "UPDATE records SET status = 'archived' WHERE seq = (SELECT max(seq) FROM "
                    "records WHERE workspace = %s AND entity = %s AND enriched_at IS NOT NULL "
                    "AND NOT tombstone AND collection = 'main')", (ws, entity))
            if step % 17 == 5:
                # The readiness transition that rolls back: never on the topic.
                with psycopg.connect(dsn) as conn:
                    conn.execute("UPDATE records SET enriched_at = now() WHERE seq = %s",
                                 (never,))
                    conn.rollback()
        # A rewrite that changes nothing but is still a commit.
        if unready:
            store.mark_ready(unready)
        with store.conn.transaction():
            store.conn.execute("DELETE FROM records WHERE workspace = %s AND entity = %s "
                               "AND collection = 'main' AND seq = (SELECT min(seq) FROM "
                               "records WHERE workspace = %s AND entity = %s AND "
                               "collection = 'main' AND seq <> %s)",
                               (ws, ENTITIES[2], ws, ENTITIES[2], never))
            # A key change (entity moved): a delete under the old key, a create under
            # the new one, so each partition's history stays whole.
            store.conn.execute("UPDATE records SET entity = %s WHERE seq = (SELECT max(seq) "
                               "FROM records WHERE workspace = %s AND entity = %s AND "
                               "collection = 'main')", (ENTITIES[5], ws, ENTITIES[4]))
            store.conn.execute("DELETE FROM derivation_cursors WHERE workspace = %s AND "
                               "derivation = 'digest' AND entity = %s", (ws, ENTITIES[3]))
    finally:
        store.close()
    return facts


def _by_key(msgs: list[Msg]) -> dict[bytes, list[Msg]]:
    out: dict[bytes, list[Msg]] = defaultdict(list)
    for m in msgs:
        assert m.key is not None
        out[m.key].append(m)
    return out


def _comparable_envelope(value: bytes) -> dict[str, Any]:
    doc = json.loads(value)
    for k in ("ts_ms", "ts_us", "ts_ns"):
        doc.pop(k)
    doc["source"].pop("version")
    doc["source"].pop("sequence")
    return doc


def _comparable_event(value: bytes, key: bytes) -> tuple[Any, ...]:
    ev = parse(value, key)
    assert ev is not None and not isinstance(ev, str)
    raw = ev.raw  # type: ignore[union-attr]
    payload: Any
    if isinstance(ev, RecordEvent):
        payload = (ev.after, ev.before)
    else:
        assert isinstance(ev, CursorAdvance)
        payload = (ev.row, ev.before, ev.cursor_advanced() is not None)
    return (type(ev).__name__, ev.op, ev.table, raw.id, raw.op, raw.new, raw.old,  # type: ignore[union-attr]
            raw.change_id, ev.tx_id, payload)  # type: ignore[union-attr]


def test_debezium_and_relay_streams_are_equal(debezium: DebeziumSession, tansu_broker: Any) -> None:
    ws = f"ws-{secrets.token_hex(4)}"
    parts = debezium.partitions
    relays = {
        "relay-kafka": Relay(debezium.dsn, debezium.bootstrap, topic=f"wl-relay-{ws}",
                             slot=debezium.new_slot(), partitions=parts),
        "relay-tansu": Relay(debezium.dsn, tansu_broker.bootstrap, topic=f"wl-relay-{ws}",
                             slot=debezium.new_slot(), partitions=parts),
    }
    try:
        for r in relays.values():
            r.start()
        # The relays stream concurrently with the workload, as in production.
        stop = threading.Event()
        threads = [threading.Thread(target=r.run_forever, args=(stop,), daemon=True)
                   for r in relays.values()]
        for t in threads:
            t.start()
        facts = run_workload(debezium.dsn, ws, seed=20260719)
        markers = write_markers(debezium.dsn, ws, parts)
        stop.set()
        for t in threads:
            t.join(30)
        for r in relays.values():
            drain_relay(r)
        streams = {"debezium": read_workspace(debezium.bootstrap, debezium.topic, ws,
                                              until=markers)}
        streams["relay-kafka"] = read_workspace(debezium.bootstrap, relays["relay-kafka"].topic,
                                                ws, until=markers)
        streams["relay-tansu"] = read_workspace(tansu_broker.bootstrap,
                                                relays["relay-tansu"].topic, ws, until=markers)
    finally:
        for r in relays.values():
            r.close()
            r.drop_slot()

    dbz = _by_key(streams["debezium"])
    assert len(streams["debezium"]) > 80, "the workload should produce a real stream"
    with psycopg.connect(debezium.dsn) as conn:
        n_rec, n_cur = conn.execute(
            "SELECT (SELECT count(*) FROM records WHERE workspace = %s), "
            "(SELECT count(*) FROM derivation_cursors WHERE workspace = %s)", (ws, ws)).fetchone()
    assert n_rec > 60 and n_cur > 0

    for name in ("relay-kafka", "relay-tansu"):
        got = _by_key(streams[name])
        assert set(got) == set(dbz), f"{name}: different keys"
        for key, expected in dbz.items():
            mine = got[key]
            # Same partition, as the Java partitioner computes it.
            want_part = partition_for(key, parts)
            assert {m.partition for m in expected} == {want_part}, key
            assert {m.partition for m in mine} == {want_part}, (name, key)
            # Same events in the same order, parsed by the one envelope module ...
            assert [_comparable_event(m.value, key) for m in mine] == \
                [_comparable_event(m.value, key) for m in expected], (name, key)  # type: ignore[arg-type]
            # ... and the same raw envelopes, LSNs, txIds and commit times included.
            assert [_comparable_envelope(m.value) for m in mine] == \
                [_comparable_envelope(m.value) for m in expected], (name, key)  # type: ignore[arg-type]

    # Key bytes are Debezium's own (the set equality above compares bytes);
    # the control character is escaped upper-case like Jackson does.
    assert key_of(ws, "user:\x1fctl") not in dbz
    assert b'"entity":"user:\\u001Fctl"' in b"".join(dbz)

    # The rolled-back readiness never appears; the record stays unready everywhere.
    never = facts["never_ready"]
    for name, msgs in streams.items():
        for m in msgs:
            ev = parse(m.value, m.key)
            if isinstance(ev, RecordEvent) and ev.seq == never:
                assert not ev.record.ready, (name, ev)
                assert not isinstance(ev, ReadyRecord)

    # Every kind of event is exercised.
    kinds = {type(parse(m.value, m.key)).__name__ for m in streams["debezium"]}
    assert {"ReadyRecord", "UnreadyInsert", "RecordUpdate", "RecordDelete",
            "CursorAdvance"} <= kinds
    evs = [parse(m.value, m.key) for m in streams["debezium"]]
    assert any(isinstance(e, ReadyRecord) and e.tombstone for e in evs)
    assert any(isinstance(e, ReadyRecord) and e.transition for e in evs)
    assert any(isinstance(e, UnreadyInsert) for e in evs)
    assert any(isinstance(e, RecordUpdate) for e in evs)
    # The TOASTed record arrives whole after its readiness UPDATE.
    big = [e for e in evs if isinstance(e, ReadyRecord) and e.transition
           and "big" in e.record.content]
    assert big and len(big[0].record.content["big"]) == 40_000

    # Commit order along a partition: position strictly increases (the relay
    # always knows it; Debezium once it has seen a commit).
    for name, msgs in streams.items():
        for key, ms in _by_key(msgs).items():
            positions = [parse(m.value, m.key).position for m in ms]  # type: ignore[union-attr]
            known = [p for p in positions if p]
            assert known == sorted(known) and len(set(known)) == len(known), (name, key)
            if name != "debezium":
                assert all(positions), (name, key)

    # Folding the stream gives PostgreSQL's current rows (invariant 1).
    with psycopg.connect(debezium.dsn) as conn:
        rows = {r[0] for r in conn.execute(
            "SELECT seq FROM records WHERE workspace = %s", (ws,)).fetchall()}
    # Across partitions, commit order is the position; a key change's delete and
    # create share one position, the delete first.
    evs = [e for e in (parse(m.value, m.key) for m in streams["relay-kafka"])
           if isinstance(e, RecordEvent)]
    live: dict[int, bool] = {}
    for e in sorted(evs, key=lambda e: (e.position, e.op != "d")):
        live[e.seq] = e.op != "d"
    assert {s for s, alive in live.items() if alive} == rows


def test_relay_snapshot_matches_debezium_initial_snapshot(debezium: DebeziumSession) -> None:
    ws = debezium.snapshot_workspace
    with psycopg.connect(debezium.dsn) as conn:
        keys = [key_of(ws, e) for (e,) in conn.execute(
            "SELECT DISTINCT entity FROM records WHERE workspace = %s UNION "
            "SELECT DISTINCT entity FROM derivation_cursors WHERE workspace = %s",
            (ws, ws)).fetchall()]
    dbz = [m for m in read_workspace(debezium.bootstrap, debezium.topic, ws, until=keys)
           if json.loads(m.value)["op"] == "r"]  # type: ignore[arg-type]
    topic = f"wl-snap-{secrets.token_hex(4)}"
    relay = Relay(debezium.dsn, debezium.bootstrap, topic=topic, slot=debezium.new_slot(),
                  partitions=debezium.partitions)
    try:
        seen: list[tuple[int, int]] = []
        n = relay.snapshot(workspace=ws, progress=lambda done, total: seen.append((done, total)))
    finally:
        relay.close()
    assert n == len(dbz) == 6
    assert seen[-1] == (n, n)
    mine = read_workspace(debezium.bootstrap, topic, ws, until=keys)
    assert len(mine) == n

    def norm(m: Msg) -> tuple[Any, ...]:
        doc = json.loads(m.value)  # type: ignore[arg-type]
        src = doc["source"]
        ident = doc["after"].get("seq") or doc["after"]["derivation"]
        return (m.key, m.partition, src["table"], ident, doc["op"], doc["before"],
                json.dumps(doc["after"], sort_keys=True), src["connector"], src["db"],
                src["schema"], src["name"])

    assert sorted(map(norm, mine)) == sorted(map(norm, dbz))
    # Debezium's snapshot markers, computed over the snapshot the relay took.
    markers = [json.loads(m.value)["source"]["snapshot"] for m in  # type: ignore[arg-type]
               sorted(mine, key=lambda m: (json.loads(m.value)["source"]["table"] != "records",  # type: ignore[arg-type]
                                           norm(m)[3]))]
    assert markers[0] == "first" and markers[-1] == "last"
    assert set(markers[1:-1]) <= {"true", "first_in_data_collection", "last_in_data_collection"}
    for m in mine:
        ev = parse(m.value, m.key)
        assert ev is not None and ev.snapshot and ev.position == 0  # type: ignore[union-attr]
        assert json.loads(m.value)["source"]["sequence"].startswith("[null,")  # type: ignore[arg-type]
