"""pgoutput protocol-1 messages decode to the right dataclasses; bad bytes fail clearly."""

from __future__ import annotations

import pytest

from tests.unit.cdc import pgbuild as pb
from wakeline.cdc import pgoutput as po
from wakeline.cdc.errors import PgOutputError


def test_begin_and_commit_carry_lsns_xid_and_unix_time() -> None:
    b = po.decode(pb.begin(0x1B4FC98, 1_796_229_671_373_534, 761))
    assert b == po.Begin(0x1B4FC98, 1_796_229_671_373_534, 761)
    c = po.decode(pb.commit(0x100, 0x130, 1_796_229_671_373_534))
    assert c == po.Commit(0, 0x100, 0x130, 1_796_229_671_373_534)


def test_relation_lists_columns_with_types_and_key_flags() -> None:
    rel = po.decode(pb.relation(16398, "public", "records", pb.RECORD_COLUMNS))
    assert isinstance(rel, po.Relation)
    assert (rel.oid, rel.namespace, rel.name, rel.replica_identity) == \
        (16398, "public", "records", "f")
    assert [c.name for c in rel.columns][:3] == ["seq", "workspace", "entity"]
    assert rel.columns[8] == po.Column("content", 3802, -1, True)


def test_tuples_hold_text_null_and_unchanged_toast() -> None:
    ins = po.decode(pb.insert(7, ["1", None, "é\x01"]))
    assert ins == po.Insert(7, ("1", None, "é\x01"))
    upd = po.decode(pb.update(7, ["1", "a"], ["1", b"u"]))
    assert isinstance(upd, po.Update)
    assert upd.old_kind == "O" and upd.old == ("1", "a")
    assert upd.new == ("1", po.UNCHANGED_TOAST)
    assert po.decode(pb.update(7, None, ["2"])) == po.Update(7, None, None, ("2",))
    assert po.decode(pb.update(7, ["1"], ["2"], kind=b"K")).old_kind == "K"  # type: ignore[union-attr]
    assert po.decode(pb.delete(7, ["1", None])) == po.Delete(7, "O", ("1", None))


def test_truncate_type_origin_and_messages() -> None:
    assert po.decode(pb.truncate([1, 2], options=3)) == po.Truncate((1, 2), True, True)
    assert po.decode(pb.type_msg(99, "public", "mood")) == po.Type(99, "public", "mood")
    assert po.decode(pb.origin(42, "node-a")) == po.Origin(42, "node-a")
    assert po.decode(pb.message(77, "wakeline.relay.heartbeat", b"")) == \
        po.Message(False, 77, "wakeline.relay.heartbeat", b"")
    assert po.decode(pb.message(78, "app", b"xy", transactional=True)).transactional  # type: ignore[union-attr]


@pytest.mark.parametrize("data, fragment", [
    (b"", "empty"),
    (b"Z\x00\x00", "unknown pgoutput message type 'Z'"),
    (pb.insert(7, ["hello"])[:-2], "malformed pgoutput 'I'"),
    (b"B\x00\x01", "malformed pgoutput 'B'"),
    (b"I" + b"\x00\x00\x00\x07" + b"X", "expected 'N'"),
    (b"D" + b"\x00\x00\x00\x07" + b"N" + pb.tuple_data(["1"]), "expected 'K' or 'O'"),
    (b"I\x00\x00\x00\x07N\x00\x01b\x00\x00\x00\x01x", "binary tuple data"),
    (b"I\x00\x00\x00\x07N\x00\x01q", "unknown tuple column kind"),
    (pb.insert(7, [b"\xff\xfe"]), "malformed"),
])
def test_malformed_messages_raise_pgoutput_error(data: bytes, fragment: str) -> None:
    with pytest.raises(PgOutputError, match=fragment.replace("(", r"\(")) as info:
        po.decode(data)
    assert info.value.code == "cdc.pgoutput"
