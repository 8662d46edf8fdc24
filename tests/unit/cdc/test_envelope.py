"""The one envelope parser, on real Debezium output and on every kind of bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.cdc import samples
from wakeline.cdc import (
    CursorAdvance,
    ReadyRecord,
    RecordDelete,
    RecordUpdate,
    TransactionMarker,
    UnreadyInsert,
    parse,
)
from wakeline.cdc.envelope import position_of
from wakeline.cdc.errors import BadValue
from wakeline.core.events import CursorAdvanced, RecordChanged


def _parse(m: dict[str, Any]) -> Any:
    return parse(m["value"].encode(), m["key"].encode())


def _value(m: dict[str, Any]) -> dict[str, Any]:
    return json.loads(m["value"])


def test_every_captured_message_parses() -> None:
    kinds = [type(_parse(m)).__name__ for m in samples.messages()]
    assert kinds.count("ReadyRecord") >= 4 and "UnreadyInsert" in kinds
    assert {"RecordUpdate", "RecordDelete", "CursorAdvance"} <= set(kinds)


def test_unready_insert_maps_to_rec() -> None:
    m = samples.find("c", "records", lambda v: v["after"]["type"] == "chat")
    ev = _parse(m)
    assert isinstance(ev, UnreadyInsert)
    rec = ev.after
    assert (ev.workspace, ev.entity, ev.op) == ("w", "user:mia", "c")
    assert rec.content == {"k": "v", "n": 1.5, "u": "é\x01", "deep": {"l": [1, None, True]}}
    assert rec.text == "t\x01x" and rec.parents == (1,) and rec.type == "chat"
    assert rec.enriched_at is None and not rec.ready
    v = _value(m)
    assert rec.created_at == pytest.approx(
        __import__("datetime").datetime.fromisoformat(v["after"]["created_at"]).timestamp())
    changed = ev.record_changed()
    assert isinstance(changed, RecordChanged)
    assert changed.op == "c" and changed.after == rec and changed.before is None
    assert changed.lsn == ev.position == position_of(
        int(json.loads(v["source"]["sequence"])[0]), v["source"]["lsn"])


def test_readiness_update_is_a_ready_record_transition() -> None:
    m = samples.find("u", "records", lambda v: v["after"]["type"] == "chat"
                     and v["before"]["enriched_at"] is None)
    ev = _parse(m)
    assert isinstance(ev, ReadyRecord) and ev.transition and not ev.tombstone
    assert ev.before is not None and not ev.before.ready
    assert ev.after is not None and ev.after.ready
    assert ev.after.annotations == {"sentiment_v1": {"valence": 0.5}}
    assert ev.after.scores == {"importance": 7}


def test_toasted_row_is_whole_after_its_update() -> None:
    m = samples.find("u", "records", lambda v: "big" in v["after"]["content"])
    ev = _parse(m)
    assert isinstance(ev, ReadyRecord) and len(ev.record.content["big"]) == 8000
    assert ev.entity == "team:🚀"


def test_tombstone_is_a_ready_record() -> None:
    ev = _parse(samples.find("c", "records", lambda v: v["after"]["tombstone"]))
    assert isinstance(ev, ReadyRecord) and ev.tombstone and not ev.transition
    assert ev.record.key == "name" and len(ev.record.parents) == 1


def test_other_updates_and_deletes() -> None:
    upd = _parse(samples.find("u", "records", lambda v: v["after"]["status"] == "archived"))
    assert isinstance(upd, RecordUpdate) and upd.before.ready and upd.after.ready
    dele = _parse(samples.find("d", "records"))
    assert isinstance(dele, RecordDelete) and dele.after is None and dele.before is not None
    assert dele.record_changed().op == "d" and dele.seq == dele.before.seq
    assert dele.raw.op == "delete" and dele.raw.new is None and dele.raw.old["seq"] == dele.seq


def test_cursor_rows() -> None:
    ins = _parse(samples.find("c", "derivation_cursors"))
    assert isinstance(ins, CursorAdvance) and ins.derivation == "summary"
    assert ins.last_outcome is None and ins.cursor_advanced() is None
    adv = _parse(samples.find("u", "derivation_cursors"))
    assert isinstance(adv, CursorAdvance)
    assert adv.watermark > 0 and adv.last_success_at is not None
    assert adv.at_handled_through is not None and adv.last_job_id == "job-1"
    core = adv.cursor_advanced()
    assert isinstance(core, CursorAdvanced)
    assert (core.derivation, core.watermark, core.outcome, core.job_id) == \
        ("summary", adv.watermark, "succeeded", "job-1")
    assert core.finished_at == adv.last_run_at and core.lsn == adv.position
    gone = _parse(samples.find("d", "derivation_cursors"))
    assert isinstance(gone, CursorAdvance) and gone.deleted and gone.cursor_advanced() is None
    assert gone.raw.id == "w/summary/user:mia"
    assert gone.change_id == f"derivation_cursors:w/summary/user:mia:{gone.lsn}"


def test_snapshot_reads() -> None:
    snap = [_parse(m) for m in samples.messages() if _value(m)["op"] == "r"]
    assert [e.source.snapshot for e in snap] == ["first", "last"]
    rec, cur = snap
    assert isinstance(rec, ReadyRecord) and rec.snapshot and rec.position == 0
    assert rec.record_changed().op == "r" and rec.record_changed().lsn == 0
    assert isinstance(cur, CursorAdvance) and cur.snapshot and cur.watermark == 3
    assert rec.raw.op == "insert" and rec.raw.snapshot


def test_raw_change_is_the_change_feed_document() -> None:
    m = samples.find("u", "records", lambda v: v["after"]["type"] == "chat"
                     and v["before"]["enriched_at"] is None)
    ev = _parse(m)
    v = _value(m)
    doc = ev.raw.to_dict()
    assert doc["table"] == "records" and doc["id"] == str(ev.seq) and doc["op"] == "update"
    assert doc["changeId"] == f"records:{ev.seq}:{v['source']['lsn']}"
    assert doc["newDoc"]["annotations"] == {"sentiment_v1": {"valence": 0.5}}
    assert doc["oldDoc"]["enriched_at"] is None
    assert doc["ts"] == v["source"]["ts_us"] / 1e6


def test_positions_increase_in_commit_order_along_a_partition() -> None:
    by_part: dict[int, list[int]] = {}
    for m in samples.messages():
        by_part.setdefault(m["partition"], []).append(_parse(m).position)
    for positions in by_part.values():
        known = [p for p in positions if p]
        assert known == sorted(known)
    # A transaction that began before another but committed after it: change
    # LSN goes back, position does not.
    early = position_of(1000, 900)   # began early, committed after the commit ending at 1000
    late = position_of(800, 950)     # began later, committed first (its previous commit: 800)
    assert late < early
    assert position_of(None, 5) == 0 and position_of(5, 6, snapshot=True) == 0


def test_unavailable_toast_placeholder_is_filled_from_before() -> None:
    v = _value(samples.find("u", "records", lambda v: v["after"]["type"] == "chat"))
    v["after"]["content"] = "__debezium_unavailable_value"
    ev = parse(json.dumps(v))
    assert ev.after.content == ev.before.content != {}  # type: ignore[union-attr]
    v["before"] = None
    with pytest.raises(Exception, match="REPLICA IDENTITY FULL") as info:
        parse(json.dumps(v))
    assert info.value.code == "cdc.envelope.bad_value"  # type: ignore[attr-defined]


def test_kafka_tombstone_transaction_markers_and_schema_wrapping() -> None:
    assert parse(None) is None
    begin = parse(b'{"status":"BEGIN","id":"571:53195832","event_count":null,'
                  b'"data_collections":null,"ts_ms":1}')
    assert begin == TransactionMarker("BEGIN", "571:53195832", None, (), 1)
    end = parse(json.dumps({"status": "END", "id": "571:1", "event_count": 2,
                            "data_collections": [{"data_collection": "public.records",
                                                  "event_count": 2}]}))
    assert isinstance(end, TransactionMarker) and end.data_collections == (("public.records", 2),)
    m = samples.find("c", "records", lambda v: v["after"]["type"] == "chat")
    wrapped = json.dumps({"schema": {"type": "struct"}, "payload": _value(m)})
    assert parse(wrapped, m["key"]) == _parse(m)
    tx = _value(m)
    tx["transaction"] = {"id": "761:28638400", "total_order": 1, "data_collection_order": 1}
    assert parse(json.dumps(tx)).transaction.total_order == 1  # type: ignore[union-attr]


def _good() -> dict[str, Any]:
    return _value(samples.find("c", "records", lambda v: v["after"]["type"] == "chat"))


def _with(path: str, value: Any) -> bytes:
    doc = _good()
    node = doc
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    if value is _DROP:
        del node[last]
    else:
        node[last] = value
    return json.dumps(doc).encode()


_DROP = object()


@pytest.mark.parametrize("value, code", [
    (b"\x00\xff\xfegarbage", "cdc.envelope.not_json"),
    (b"{\"before\":null,\"after\":{\"seq\":1", "cdc.envelope.not_json"),
    (b"not json at all", "cdc.envelope.not_json"),
    (b"[1,2,3]", "cdc.envelope.not_an_envelope"),
    (_with("op", "t"), "cdc.envelope.unknown_op"),
    (_with("op", "x"), "cdc.envelope.unknown_op"),
    (_with("op", _DROP), "cdc.envelope.missing_field"),
    (_with("source.table", "jobs"), "cdc.envelope.unknown_table"),
    (_with("source", _DROP), "cdc.envelope.missing_field"),
    (_with("after", None), "cdc.envelope.missing_field"),
    (_with("after.seq", _DROP), "cdc.envelope.missing_field"),
    (_with("after.workspace", _DROP), "cdc.envelope.missing_field"),
    (_with("after.seq", "1"), "cdc.envelope.bad_value"),
    (_with("after.content", "{not json"), "cdc.envelope.bad_value"),
    (_with("after.content", "[1]"), "cdc.envelope.bad_value"),
    (_with("after.enriched_at", "yesterday"), "cdc.envelope.bad_value"),
    (_with("after.enriched_at", 1700000000000), "cdc.envelope.bad_value"),
    (_with("after.parents", ["a"]), "cdc.envelope.bad_value"),
    (_with("after.tombstone", "no"), "cdc.envelope.bad_value"),
    (_with("source.lsn", "12"), "cdc.envelope.bad_value"),
    (_with("source.sequence", "nope"), "cdc.envelope.bad_value"),
])
def test_bad_envelopes_say_why(value: bytes, code: str) -> None:
    with pytest.raises(Exception) as info:
        parse(value)
    assert getattr(info.value, "code", None) == code, info.value


def test_oversized_and_key_mismatch() -> None:
    good = json.dumps(_good()).encode()
    with pytest.raises(Exception) as info:
        parse(good, max_bytes=100)
    assert info.value.code == "cdc.envelope.oversized"  # type: ignore[attr-defined]
    assert parse(good, max_bytes=len(good)) is not None
    with pytest.raises(Exception) as info:
        parse(good, b'{"workspace":"w","entity":"someone-else"}')
    assert info.value.code == "cdc.envelope.bad_value"  # type: ignore[attr-defined]
    with pytest.raises(Exception) as info:
        parse(good, b"\xff")
    assert info.value.code == "cdc.envelope.not_json"  # type: ignore[attr-defined]


def test_tables_filter() -> None:
    good = json.dumps(_good()).encode()
    with pytest.raises(Exception) as info:
        parse(good, tables=frozenset({"derivation_cursors"}))
    assert info.value.code == "cdc.envelope.unknown_table"  # type: ignore[attr-defined]


class _Str(str):
    pass


def _variants(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The row as captured, with columns missing, null, or of a subtype, one at a time."""
    out = [row]
    for col in ("collection_version", "type", "status", "key", "text", "tombstone", "parents",
                "content", "annotations", "scores", "enriched_at", "created_at"):
        out.append({k: v for k, v in row.items() if k != col})
        out.append({**row, col: None})
    out += [{**row, "type": _Str("chat")}, {**row, "status": ""}, {**row, "parents": [1, 2]},
            {**row, "parents": []}, {**row, "tombstone": True}, {**row, "key": "k"}]
    return out


def test_record_fast_path_builds_what_the_checked_path_builds() -> None:
    """``_to_rec`` builds the common row directly; for every row, captured or varied, it
    must equal what ``_to_rec_checked`` (the validating path) builds, or raise the same."""
    from wakeline.cdc import envelope as E

    rows = [r for m in samples.messages() for r in (_value(m).get("after"),
                                                     _value(m).get("before"))
            if r is not None and "seq" in r]
    assert rows
    checked = 0
    for captured in rows:
        for row in _variants(E._decoded(E.RECORDS, captured) or {}):
            try:
                want: Any = E._to_rec_checked(row)
            except Exception as exc:  # noqa: BLE001 - compared below
                want = (type(exc), str(exc))
            try:
                got: Any = E._to_rec(row)
            except Exception as exc:  # noqa: BLE001
                got = (type(exc), str(exc))
            assert got == want, (row, got, want)
            checked += 1
    assert checked > 100


def test_bad_record_columns_still_say_which() -> None:
    m = samples.find("c", "records", lambda v: v["after"]["type"] == "chat")
    for col, bad in (("seq", "7"), ("parents", [True]), ("tombstone", "yes"),
                     ("collection", 3), ("content", "[1]")):
        v = _value(m)
        v["after"][col] = bad
        with pytest.raises(BadValue) as ei:
            parse(json.dumps(v).encode(), m["key"].encode())
        assert ei.value.context.get("field") == col, (col, ei.value)
