"""The relay's decoding, without services: pgoutput rows in, Debezium messages out.

The strongest check here: rebuilding the pgoutput tuples of real Debezium
messages and running them through the relay gives the same key bytes and the
same value, field for field (only the connector version and the write time
differ).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.cdc import pgbuild as pb
from tests.unit.cdc import samples
from wakeline.cdc.compose import SourceTemplate, snapshot_marker
from wakeline.cdc.errors import RelayError
from wakeline.cdc.relay import Batch, Relay, format_lsn, parse_lsn

REC_OID, CUR_OID, OTHER_OID = 16398, 16420, 16500


class FakeProducer:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.fail = fail
        self._cbs: list[Any] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any = None) -> None:
        self.sent.append((topic, key, value))
        self._cbs.append(on_delivery)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        for cb in self._cbs:
            cb("boom" if self.fail else None, None)
        self._cbs = []
        return 0

    def purge(self) -> None:
        self._cbs = []


def relay(prev_commit: int = 500, producer: FakeProducer | None = None) -> Relay:
    r = Relay("postgresql://unused", producer=producer or FakeProducer(), topic="t")  # type: ignore[arg-type]
    r._source = SourceTemplate(db="cdc", name="wakeline")
    r._prev_commit = prev_commit
    return r


def rows(*msgs: tuple[int, bytes]) -> list[tuple[int, bytes]]:
    return list(msgs)


RELATIONS = [(1, pb.relation(REC_OID, "public", "records", pb.RECORD_COLUMNS)),
             (1, pb.relation(CUR_OID, "public", "derivation_cursors", pb.CURSOR_COLUMNS))]


def _text(v: Any, type_oid: int) -> str | None:
    if v is None:
        return None
    if type_oid == 16:
        return "t" if v else "f"
    if type_oid == 1016:
        return "{" + ",".join(map(str, v)) + "}"
    if type_oid == 1184:  # ZonedTimestamp → PostgreSQL's ISO output in UTC
        return v.replace("T", " ").replace("Z", "+00")
    return str(v)


def _tuple(row: dict[str, Any], columns: list[tuple[str, int, int, bool]]) -> list[Any]:
    assert list(row) == [c[0] for c in columns]
    return [_text(row[c[0]], c[1]) for c in columns]


@pytest.mark.parametrize("op, table", [("c", "records"), ("u", "records"), ("d", "records"),
                                       ("c", "derivation_cursors"),
                                       ("u", "derivation_cursors"),
                                       ("d", "derivation_cursors")])
def test_relay_reproduces_real_debezium_messages(op: str, table: str) -> None:
    m = samples.find(op, table)
    v = json.loads(m["value"])
    src = v["source"]
    oid, cols = (REC_OID, pb.RECORD_COLUMNS) if table == "records" else \
        (CUR_OID, pb.CURSOR_COLUMNS)
    change = {
        "c": lambda: pb.insert(oid, _tuple(v["after"], cols)),
        "u": lambda: pb.update(oid, _tuple(v["before"], cols), _tuple(v["after"], cols)),
        "d": lambda: pb.delete(oid, _tuple(v["before"], cols)),
    }[op]()
    prev, _ = json.loads(src["sequence"])
    lsn = src["lsn"]
    r = relay(prev_commit=int(prev))
    batch = r._decode(rows(*RELATIONS, (lsn, pb.begin(lsn + 100, src["ts_us"], src["txId"])),
                           (src["lsn"], change), (lsn + 150, pb.commit(lsn + 100, lsn + 150,
                                                                         src["ts_us"]))))
    [(key, value)] = batch.messages
    assert key == m["key"].encode()
    mine = json.loads(value)
    for doc in (mine, v):
        for k in ("ts_ms", "ts_us", "ts_ns"):
            doc.pop(k)
        doc["source"].pop("version")
    assert mine == v
    assert list(mine) == list(v) and list(mine["source"]) == list(v["source"])


def test_commits_chain_prev_lsn_and_set_the_safe_point() -> None:
    r = relay(prev_commit=500)
    b = r._decode(rows(*RELATIONS,
                       (600, pb.begin(700, 1_000_000, 10)),
                       (600, pb.insert(REC_OID, pb.record_values(1))),
                       (650, pb.insert(REC_OID, pb.record_values(2, "user:b"))),
                       (720, pb.commit(700, 720, 1_000_000)),
                       (720, pb.begin(800, 2_000_000, 11)),
                       (760, pb.insert(REC_OID, pb.record_values(3))),
                       (820, pb.commit(800, 820, 2_000_000)),
                       (830, pb.message(830, "wakeline.relay.heartbeat", b""))))
    assert b.commits == 2 and len(b.messages) == 3
    assert b.last_commit_end == 820 and b.safe_lsn == 830
    seqs = [json.loads(json.loads(v)["source"]["sequence"]) for _, v in b.messages]
    assert seqs == [["500", "600"], ["500", "650"], ["720", "760"]]
    txids = [json.loads(v)["source"]["txId"] for _, v in b.messages]
    assert txids == [10, 10, 11]
    assert b.commit_times_us == [1_000_000, 2_000_000]


def test_unpublished_tables_and_truncates_are_skipped() -> None:
    r = relay()
    b = r._decode(rows(*RELATIONS,
                       (1, pb.relation(OTHER_OID, "public", "jobs", [("job_id", 25, -1, True)])),
                       (600, pb.begin(700, 1, 10)), (600, pb.insert(OTHER_OID, ["j1"])),
                       (650, pb.truncate([REC_OID])), (720, pb.commit(700, 720, 1))))
    assert b.messages == [] and b.commits == 1 and b.safe_lsn == 720
    assert r.stats.skipped_tables == 1 and r.stats.skipped_truncates == 1


def test_unchanged_toast_comes_from_the_old_row() -> None:
    r = relay()
    old = pb.record_values(1, content='{"big": "x"}', text="long")
    new = pb.record_values(1, ready=True)
    new[8], new[9] = b"u", b"u"
    b = r._decode(rows(*RELATIONS, (600, pb.begin(700, 1, 10)),
                       (600, pb.update(REC_OID, old, new)), (720, pb.commit(700, 720, 1))))
    after = json.loads(b.messages[0][1])["after"]
    assert after["content"] == '{"big": "x"}' and after["text"] == "long"
    # Without an old row, Debezium's placeholder.
    b = r._decode(rows((600, pb.begin(700, 1, 10)), (600, pb.update(REC_OID, None, new)),
                       (720, pb.commit(700, 720, 1))))
    assert json.loads(b.messages[0][1])["after"]["content"] == "__debezium_unavailable_value"


def test_key_change_is_delete_then_create() -> None:
    r = relay()
    b = r._decode(rows(*RELATIONS, (600, pb.begin(700, 1, 10)),
                       (600, pb.update(REC_OID, pb.record_values(1, "user:a"),
                                       pb.record_values(1, "user:b"))),
                       (720, pb.commit(700, 720, 1))))
    (k1, v1), (k2, v2) = b.messages
    assert b'"user:a"' in k1 and json.loads(v1)["op"] == "d"
    assert b'"user:b"' in k2 and json.loads(v2)["op"] == "c"


def test_change_before_relation_or_outside_a_transaction_is_an_error() -> None:
    with pytest.raises(RelayError, match="before its Relation"):
        relay()._decode(rows((600, pb.begin(700, 1, 10)),
                             (600, pb.insert(REC_OID, pb.record_values(1)))))
    with pytest.raises(RelayError, match="outside a transaction"):
        relay()._decode(rows(*RELATIONS, (600, pb.insert(REC_OID, pb.record_values(1)))))


def test_publish_raises_on_delivery_errors_and_never_advances() -> None:
    ok = FakeProducer()
    r = relay(producer=ok)
    r.publish(Batch(messages=[(b"k", b"v")], commits=1))
    assert ok.sent == [("t", b"k", b"v")] and r.stats.messages == 1
    bad = relay(producer=FakeProducer(fail=True))
    with pytest.raises(RelayError, match="slot was not advanced"):
        bad.publish(Batch(messages=[(b"k", b"v")], commits=1))
    bad.acknowledge(Batch())  # nothing to advance: no database needed
    assert bad.stats.confirmed_lsn == 0


def test_lsn_text_round_trip_and_snapshot_markers() -> None:
    assert format_lsn(0x1_0000_00AB) == "1/AB" and parse_lsn("1/AB") == 0x1_0000_00AB
    rows_per_table = [2, 0, 3]
    marks = [snapshot_marker(t, 3, i, n) for t, n in enumerate(rows_per_table) for i in range(n)]
    assert marks == ["first", "last_in_data_collection", "first_in_data_collection", "true",
                     "last"]
    assert snapshot_marker(0, 1, 0, 1) == "last"


def test_options_are_checked() -> None:
    with pytest.raises(ValueError):
        Relay("postgresql://x", "b:1", snapshot="sometimes")
    with pytest.raises(ValueError):
        Relay("postgresql://x")


@pytest.mark.parametrize("prev, lsn", [(None, 5), (123, 456), (0, 2**63), (None, 0)])
def test_source_sequence_is_the_json_text_of_the_two_lsns(prev: int | None, lsn: int) -> None:
    from wakeline.cdc._json import dumps

    block = SourceTemplate(db="d").block(schema="public", table="records", ts_us=1, tx_id=1,
                                         lsn=lsn, prev_commit_lsn=prev, snapshot=None)
    assert block["sequence"] == dumps([None if prev is None else str(prev), str(lsn)])
