"""The C parser of the common records envelope (wakeline/core/_ccodec.c, ``parse_record``)
against its specification, envelope.py's ``parse``: the same event, types included, or
None (and envelope.py, which parses it or raises the error it deserves)."""

from __future__ import annotations

import copy
import json
import os
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.cdc import samples
from tests.unit.core.test_codec import typed
from tests.unit.leaks import bytes_kept
from wakeline.cdc import envelope
from wakeline.cdc.compose import SourceTemplate
from wakeline.cdc.compose import envelope as compose_envelope
from wakeline.cdc.errors import EnvelopeError

C = envelope._c_parse
pytestmark = pytest.mark.skipif(C is None and not os.environ.get("CI"),
                                reason="the C side was not built (no C compiler at install)")

MAX = envelope.DEFAULT_MAX_BYTES


def test_the_c_parser_is_built_and_used():
    assert C is not None, "wakeline.core._ccodec was not built by `pip install`"


def python_parse(value: bytes, key: Any) -> Any:
    """envelope.parse with the C side off: the event, or the error it raised."""
    saved = envelope._c_parse
    envelope._c_parse = None
    try:
        return envelope.parse(value, key)
    except EnvelopeError as exc:
        return exc
    finally:
        envelope._c_parse = saved


def agree(value: bytes, key: Any, *, common: bool = False) -> Any:
    """C gives envelope.py's event or None (always None where envelope.py raises); for
    the ``common`` form, always the event.  Returns C's answer."""
    try:
        doc = envelope._load(value, MAX)
    except EnvelopeError:
        return None  # never reaches the C side
    c = C(doc, key)
    py = python_parse(value, key)
    if isinstance(py, Exception):
        assert c is None, f"C parsed what envelope.py rejects ({py!r})"
    elif c is not None:
        assert typed(c) == typed(py)
        assert c == py
        assert c.raw == py.raw
        assert envelope.parse(value, key) == py  # parse() itself, C on
    else:
        assert not common, "C left a common envelope to envelope.py"
    return c


TS = 1_796_231_647_697_338


def row(seq: int = 5, **over: Any) -> dict[str, Any]:
    r = {"seq": seq, "workspace": "w", "entity": "user:mia", "collection": "profile",
         "collection_version": 1, "type": "", "status": "active", "key": "name",
         "content": '{"priority":3,"tags":["deadline","x"]}', "text": "", "tombstone": False,
         "parents": None, "annotations": "{}", "scores": '{"importance":12}',
         "enriched_at": "2026-12-02T17:14:07.696672Z",
         "created_at": "2026-12-02T17:14:07.69Z", "produced_by_run": None}
    r.update(over)
    return r


def doc(op: str = "c", before: Any = None, after: Any = None, *, snapshot: str | None = None,
        prev: int | None = 28_681_000, lsn: int = 28_681_072) -> dict[str, Any]:
    """An envelope as the relay writes it (compose.py)."""
    if after is None and op != "d":
        after = row()
    src = SourceTemplate(db="cdc").block(schema="public", table="records", ts_us=TS,
                                         tx_id=767, lsn=lsn, prev_commit_lsn=prev,
                                         snapshot=snapshot)
    return json.loads(compose_envelope(op, before, after if op != "d" else None, src,
                                       now_ns=TS * 1000 + 5))


def dumpb(d: Any) -> bytes:
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()


KEY = b'{"workspace":"w","entity":"user:mia"}'

COMMON = [
    ("insert, ready", doc("c")),
    ("insert, unready", doc("c", after=row(enriched_at=None))),
    ("snapshot read", doc("r", snapshot="true", prev=None)),
    ("readiness update", doc("u", before=row(enriched_at=None), after=row())),
    ("ready update", doc("u", before=row(), after=row(status="archived"))),
    ("unready update", doc("u", before=row(enriched_at=None), after=row(enriched_at=None))),
    ("update without before", doc("u")),
    ("delete", doc("d", before=row(tombstone=True))),
    ("parents, tombstone, no fraction", doc("c", after=row(
        parents=[1, 2], tombstone=True, created_at="2026-12-02T17:14:07Z", key=None,
        type=None, status=None, text=None, collection_version=None, content=None))),
    ("first commit after a start", doc("c", prev=None)),
    ("non-ASCII entity", doc("c", after=row(entity="team:é🚀"))),
]


@pytest.mark.parametrize("name,d", COMMON, ids=[n for n, _ in COMMON])
def test_the_common_envelopes_parse_alike_in_c(name, d):
    key = dumpb({"workspace": d["after" if d["op"] != "d" else "before"]["workspace"],
                 "entity": d["after" if d["op"] != "d" else "before"]["entity"]})
    ev = agree(dumpb(d), key, common=True)
    assert ev is not None
    assert agree(dumpb(d), None, common=True) is not None


def test_the_event_kinds_and_values():
    ev = C(doc("u", before=row(enriched_at=None), after=row()), KEY)
    assert type(ev) is envelope.ReadyRecord and ev.transition is True
    assert ev.position == (28_681_000 << 64) | 28_681_072
    assert ev.after.content == {"priority": 3, "tags": ["deadline", "x"]}
    assert ev.after.created_at == datetime(2026, 12, 2, 17, 14, 7, 690000, UTC).timestamp()
    assert ev.after.enriched_at == 1_796_231_647.696672
    assert ev.raw.op == "update" and ev.raw.change_id == "records:5:28681072"
    assert type(C(doc("c", after=row(enriched_at=None)), KEY)) is envelope.UnreadyInsert
    assert type(C(doc("d", before=row()), KEY)) is envelope.RecordDelete
    assert C(doc("r", snapshot="true"), KEY).position == 0


def test_every_captured_records_message_parses_alike():
    taken = 0
    for m in samples.messages():
        ev = agree(m["value"].encode(), m["key"].encode())
        taken += ev is not None
    assert taken >= 5, "the C parser took too few of the captured relay/Debezium messages"


def test_what_c_leaves_to_envelope_py():
    d = doc("c")
    m = samples.find("c", "derivation_cursors")
    cursors, cursor_key = json.loads(m["value"]), m["key"].encode()
    toast = doc("u", before=row(), after=row(text=envelope.UNAVAILABLE))
    tx = copy.deepcopy(d)
    tx["transaction"] = {"id": "767:1", "total_order": 1, "data_collection_order": 1}
    wrapped = {"schema": {}, "payload": d}
    offset = doc("c", after=row(created_at="2026-12-02T18:14:07+01:00"))
    spaced = b'{"workspace": "w", "entity": "user:mia"}'
    for value, key in [(cursors, cursor_key), (toast, KEY), (tx, KEY), (wrapped, KEY),
                       (offset, KEY), (d, spaced), (d, KEY.decode())]:
        assert C(value, key) is None
        assert not isinstance(python_parse(dumpb(value), key), Exception)
    assert C(d, b'{"workspace":"w","entity":"user:max"}') is None
    # keys that only look canonical: raw quote, backslash or control character
    for odd_text in ['a"b', "a\\b", "a\\u0062", "a\x01b"]:
        for ws, ent in [("w", odd_text), (odd_text, "e")]:
            odd = doc("c", after=row(workspace=ws, entity=ent))
            raw_key = ('{"workspace":"' + ws + '","entity":"' + ent + '"}').encode()
            assert C(odd, raw_key) is None
            agree(dumpb(odd), raw_key)
    for parents in ([1, True], [1, "2"], [1.0], "[1]"):
        assert C(doc("c", after=row(parents=parents)), KEY) is None
    for seq in ['["1","2"]x', '["1","2"],', '["1","2",]', '[ "1","2"]', '["1" ,"2"]',
                '["1","2"', '["","2"]', '["1"]', '[null]', '["1","2","3"]', '["-1","2"]']:
        assert C(doc("c") | {"source": doc("c")["source"] | {"sequence": seq}}, KEY) is None
    assert C([d], None) is None and C("x", None) is None


# -- arbitrary damage ----------------------------------------------------------------------

junk = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**70), st.floats(allow_nan=False),
                 st.text(max_size=4), st.lists(st.integers(-1, 3), max_size=3),
                 st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@st.composite
def instants(draw: Any) -> str:
    y = draw(st.sampled_from(["2026", "1970", "1969", "0001", "0000", "2400", "2300", "9999",
                              "2024", "1900"]))
    mo, d = draw(st.integers(0, 13)), draw(st.integers(0, 32))
    h, mi, s = draw(st.integers(0, 24)), draw(st.integers(0, 60)), draw(st.integers(0, 60))
    frac = draw(st.text("0123456789", max_size=9))
    sep = draw(st.sampled_from(["T", "T", " ", "t"]))
    zone = draw(st.sampled_from(["Z", "Z", "+00:00", "", "+01:30", "z"]))
    text = f"{y}-{mo:02d}-{d:02d}{sep}{h:02d}:{mi:02d}:{s:02d}" + (f".{frac}" if frac or
                                                                 draw(st.booleans()) else "")
    return text + zone


@st.composite
def sequences(draw: Any) -> Any:
    elem = st.one_of(st.none(), st.integers(0, 2**66).map(str), st.integers(0, 99),
                     st.sampled_from(["", "0012", "1_0", " 7", "x", "١٢"]))
    pair = draw(st.lists(elem, min_size=0, max_size=3))
    text = json.dumps(pair, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    return draw(st.one_of(st.just(text), st.just(text[:-1]), st.text(max_size=6), junk,
                          st.text(max_size=2).map(lambda tail: text + tail)))


json_columns = st.one_of(
    st.none(), st.just("{}"), st.just("null"), st.just("[1]"), st.just("{bad"),
    st.just('{"big":123456789012345678901234567890}'), st.just(" {} "),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2).map(json.dumps),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), junk)

ROW_FIELDS = {
    "seq": st.one_of(st.integers(-2, 2**70), junk), "workspace": st.one_of(st.text(max_size=4),
                                                                           junk),
    "entity": st.one_of(st.text(max_size=6), st.just('a"b'), st.just("a\\b"), st.just("\x01"),
                        junk),
    "collection": st.one_of(st.text(max_size=3), junk),
    "collection_version": st.one_of(st.integers(-1, 3), junk),
    "type": junk, "status": junk, "key": junk, "text": junk,
    "tombstone": st.one_of(st.booleans(), junk),
    "parents": st.one_of(st.lists(st.one_of(st.integers(0, 9), st.booleans(), st.text(max_size=1)),
                                  max_size=3), junk),
    "content": json_columns, "annotations": json_columns, "scores": json_columns,
    "enriched_at": st.one_of(instants(), junk), "created_at": st.one_of(instants(), junk),
    "produced_by_run": st.just(envelope.UNAVAILABLE),
}
SOURCE_FIELDS = {
    "table": st.one_of(st.sampled_from(["records", "derivation_cursors", "other", ""]), junk),
    "sequence": sequences(), "lsn": st.one_of(st.integers(-1, 2**66), junk),
    "txId": st.one_of(st.integers(0, 9), junk), "ts_us": st.one_of(st.integers(0, 2**60), junk),
    "ts_ms": st.one_of(st.integers(0, 2**50), junk),
    "snapshot": st.one_of(st.sampled_from(["true", "false", "last", "", "incremental"]), junk),
    "schema": junk, "db": junk, "version": junk,
}
TOP_FIELDS = {
    "op": st.one_of(st.sampled_from(["c", "u", "d", "r", "t", "m", "cc", ""]), junk),
    "ts_ms": st.one_of(st.integers(0, 2**50), junk),
    "transaction": st.one_of(st.just({"id": "1", "total_order": 1,
                                      "data_collection_order": 1}), junk),
    "payload": junk, "schema": junk, "status": st.sampled_from(["BEGIN", "END"]), "id": junk,
}


@st.composite
def damaged(draw: Any) -> tuple[dict[str, Any], Any]:
    """A common envelope with a few fields replaced, removed or added, and a key."""
    base = copy.deepcopy(draw(st.sampled_from([d for _, d in COMMON])))
    blocks = [("top", base, TOP_FIELDS), ("source", base["source"], SOURCE_FIELDS)]
    for part in ("after", "before"):
        if isinstance(base.get(part), dict):
            blocks.append((part, base[part], ROW_FIELDS))
    for _ in range(draw(st.integers(1, 3))):
        _, block, fields = draw(st.sampled_from(blocks))
        name = draw(st.sampled_from(sorted(fields)))
        if draw(st.integers(0, 4)) == 0:
            block.pop(name, None)
        else:
            block[name] = draw(fields[name])
    if draw(st.integers(0, 5)) == 0:
        base[draw(st.sampled_from(["after", "before", "source"]))] = draw(junk)
    r = base.get("after") if base.get("op") != "d" else base.get("before")
    ws = r.get("workspace") if isinstance(r, dict) else "w"
    ent = r.get("entity") if isinstance(r, dict) else "e"
    canonical = ('{"workspace":' + json.dumps(ws, ensure_ascii=False) + ',"entity":'
                 + json.dumps(ent, ensure_ascii=False) + "}").encode()
    key = draw(st.one_of(st.just(canonical), st.just(canonical), st.none(),
                         st.just(canonical.replace(b":", b": ")), st.just(KEY),
                         st.just(b'{"workspace":"w"}'), st.just(b"not json"),
                         st.just(canonical.decode("utf-8", "replace"))))
    return base, key


@settings(max_examples=1500, deadline=None)
@given(damaged())
def test_damaged_envelopes_are_parsed_alike_or_left_to_envelope_py(case):
    d, key = case
    try:
        value = json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()
    except ValueError:
        return
    agree(value, key)


@settings(max_examples=1000, deadline=None)
@given(instants())
def test_instants_are_read_alike(text):
    d = doc("c", after=row(created_at=text, enriched_at=text))
    agree(dumpb(d), KEY)


def test_instants_at_the_edges():
    for text in ["1970-01-01T00:00:00Z", "1969-12-31T23:59:59.999999Z", "2024-02-29T12:00:00Z",
                 "2255-06-05T23:47:34.740992Z", "2255-06-05T23:47:34.740993Z",
                 "1684-07-28T00:12:25.259008Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z",
                 "2023-02-29T00:00:00Z", "2100-02-29T00:00:00Z", "2000-02-29T00:00:00.5Z",
                 "2026-12-02T17:14:07.1234567Z", "2026-12-02T17:14:07.12345678Z",
                 "2026-12-02T17:14:07.123456789Z", "2026-12-02T17:14:07.Z",
                 "2026-12-02T17:14:07.000001Z", "2026-12-02T24:00:00Z",
                 "2026-12-02T17:14:60Z", "2026-13-02T17:14:07Z", "2026-00-02T17:14:07Z"]:
        agree(dumpb(doc("c", after=row(created_at=text))), KEY)
    ev = C(doc("c", after=row(created_at="2000-02-29T00:00:00.5Z")), KEY)
    assert ev.after.created_at == 951782400.5


def test_no_memory_is_kept_between_calls():
    good = [d for _, d in COMMON]
    bad = [doc("u", before=row(), after=row(text=envelope.UNAVAILABLE)),
           doc("c", after=row(content="{bad")), doc("c", after=row(created_at="2023-02-29T0Z")),
           doc("c", after=row(parents=[1, "x"])), doc("c", prev=None, lsn=-1)]

    def once() -> None:
        for d in good:
            assert C(d, None) is not None
        for d in bad:
            C(d, KEY)
        assert C(good[0], b"{}") is None

    grown = bytes_kept(once)
    assert grown < 8_000, f"{grown} bytes kept after 500 rounds"
