"""The C state writer and reader (wakeline/core/_ccodec.c) against their specification,
the Python writer and reader of wakeline.core.codec: the same bytes and the same states
(types included), or None (and codec.py) for what the C side leaves to it."""

from __future__ import annotations

import math
import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.core.helpers import sim_for
from tests.unit.core.test_codec import MORE, OLD_STATE, states, typed, values
from tests.unit.core.test_state import random_history
from tests.unit.leaks import bytes_kept
from wakeline.core import codec
from wakeline.core.codec import decode_state, encode_body, encode_state
from wakeline.core.plan import Fact
from wakeline.core.state import DState, EntityState, Job

try:
    from wakeline.core import _ccodec
except ImportError:  # pragma: no cover - exercised only where no C compiler ran
    _ccodec = None

pytestmark = pytest.mark.skipif(_ccodec is None and not os.environ.get("CI"),
                                reason="the C writer was not built (no C compiler at install)")


def test_the_c_writer_is_built_and_used():
    """CI's machine has a C compiler, so the install must have built the writer, and
    encode_state must use it (unless switched off for a benchmark)."""
    assert _ccodec is not None, "wakeline.core._ccodec was not built by `pip install`"
    if not os.environ.get("WAKELINE_PURE_CODEC"):
        assert codec._c_encode_body is _ccodec.encode_body


def same(state: EntityState) -> bytes:
    """Both writers give the same bytes; both readers give back ``state``, types and
    all, from them."""
    for identity in (False, True):
        c = _ccodec.encode_body(state, identity)
        assert c is not None, "the core's shapes are the C writer's"
        assert c == encode_body(state, identity)
        ws, ent = (None, None) if identity else (state.workspace, state.entity)
        back = _ccodec.decode_body(c, ws, ent)
        assert back is not None, "what the writer wrote, the reader reads"
        assert typed(back) == typed(codec.decode_body(c, ws, ent)) == typed(state)
    return c


def test_the_core_classes_are_read_and_built_through_their_fields_offsets():
    """Slotted dataclasses (source) or extension types (compiled: their members' offsets
    are found by a probe): either way the writer reads each field at its offset and the
    reader builds each object without calling the class.  A layout it cannot map would
    still encode and decode, by name, several times slower."""
    from wakeline import _compiled
    from wakeline.cdc import envelope
    from wakeline.core import engine, plan, state
    from wakeline.streams import ready, sinks

    if os.environ.get("WAKELINE_PURE_CODEC"):
        pytest.skip("the C side is switched off")
    assert ready._c_items is not None and sinks._c_rows is not None
    assert envelope._c_parse is not None
    compiled = _compiled.compiled(state)
    assert _compiled.compiled(engine) == compiled and _compiled.compiled(plan) == compiled
    if os.environ.get("CI") and os.environ.get("WAKELINE_PURE") != "1":
        assert compiled
    assert _ccodec.layout() == dict.fromkeys(
        ("Fact", "DState", "EntityState", "Job", "Rec", "RecordChanged", "Outcome"), True)
    # a state the reader made is a whole object: its method table works too
    st = codec.decode_state(codec.encode_state(EntityState("w", "e", ds={"d": DState(w=3)})),
                            "w", "e")
    assert st.d("d").w == 3 and st.d("new").w == 0


def test_a_hand_written_state():
    same(OLD_STATE)
    same(EntityState("w", "e"))


@settings(max_examples=400, deadline=None)
@given(states())
def test_arbitrary_states_give_the_same_bytes(state):
    same(state)


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=1, max_size=40))
def test_arbitrary_values_give_the_same_bytes(vals):
    vals = vals + [f"s{i}" for i in range(70)] + [(i, i) for i in range(20)] + vals
    same(EntityState("w", "e", unready={1: vals}, census_base={3: vals}))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(5, 40))
def test_every_state_the_core_makes_gives_the_same_bytes(tmp_path_factory, seed, steps):
    rnd = random.Random(seed)
    sim = sim_for(tmp_path_factory.mktemp("cat"), MORE, run_duration=rnd.choice([0.0, 45.0]))
    random_history(sim, rnd, steps)
    sim.advance(rnd.choice([5, 100, 4000]))
    assert sim.states
    for state in sim.states.values():
        same(state)


EDGES: list[Any] = [
    0, 63, 64, 65, -1, -64, 2**63 - 1, 2**63, 2**64 + 63, 2**64 + 64, 2**127 + 5, -(2**63),
    -(2**63) - 1, -(2**100), 0.0, -0.0, 1.0, -3.0, 2.0**53, -(2.0**53), 2.0**53 - 1, 1e300,
    5e-324, math.inf, -math.inf, math.nan, 1784451600.5, 1784451600.25, 1784451600.25,
    -1784451600.25, "", "a", "x" * 31, "x" * 32, "é" * 20, "\ud800x", "0123abcd", "0123ABCD",
    "0123abc", "0123abcde", "ab" * 40, True, False, None, (), [], {}, (1, 2), (1, True),
    (1.0, 2), tuple(range(20)), list(range(20)), {i: i for i in range(20)},
    {"k": [1, (2, 3)], 5: None},
]


def test_edge_values_give_the_same_bytes():
    same(EntityState("w", "e", unready={1: EDGES, 2: list(reversed(EDGES))}))
    for v in EDGES:
        same(EntityState("w", "e", census_base={0: v}, alerted=[v], last_lsn=v))


@pytest.mark.parametrize("jid", [
    "ws/d/ent/0", "ws/d/ent/7", "ws/d/ent/07", "ws/d/ent/00", "ws/d/ent/", "ws/d/ent/1x",
    "ws/d/ent/" + "9" * 40, "ws/d/ent/\u0661", "ws/d/other/3", "x", "ws/d/ent/-1",
    "ws/d/ent/1_0", "ws/d/ent/ 1", "wś/d/ent/3"])
def test_job_ids_give_the_same_bytes(jid):
    for ws in ("ws", "wś"):
        job = Job(jid.replace("ws/", f"{ws}/", 1), {"r": 1.5}, 2.0, ["a"], [], 3.0)
        same(EntityState(ws, "ent", ds={"d": DState(queued=job, running=job)}))


def test_raw_facts_and_odd_field_types_give_the_same_bytes():
    fs = {
        3: Fact(4, "main", None, False, True, "", True, None, 1.0, (0,), {}),  # key != seq
        5: Fact(5, "main", None, 0, True, "", True, None, 1.0, (0,), {}),  # int, not bool
        "x": Fact(6, "main", None, False, True, "", True, None, 1.0, (0,), {}),
        7: Fact(7, "main", "k", False, True, 12, True, 7, 7, [0, 1], {1: [1.5]}),
        8: Fact(8, "main", "k", False, True, "", True, 7, 7.0, (), {}),
        9: Fact(9, "main", "k", False, True, "", True, "a", "a", (), {}),
        10: Fact(10, "main", "k", False, True, "", True, True, 1, (), {}),
        11: Fact(11, "main", "k", False, True, "", True, 2**70, 2**70, (), {}),
    }
    ds = {"d": DState(w="x", total=2**70, dead=None, jobs_made=-1, waiting_on=2**70,
                      cron_last=[]), "e": DState(w=2**40, total=False)}
    same(EntityState("w", "e", facts=fs, ds=ds, unready={2**40: [], "u": [], 3: []},
                     alerted=(1,), last_lsn=None))


class Sub(int):
    pass


class Odd:
    pass


@pytest.mark.parametrize("state", [
    EntityState("w", "e", unready={1: [Sub(3)]}),
    EntityState("w", "e", unready={1: [{"a": frozenset()}]}),
    EntityState("w", "e", facts={1: ("not", "a", "fact")}),
    EntityState("w", "e", unready={2**64: []}),  # a sequence number beyond 64 bits
    EntityState("w", "e", ds={1: DState()}),  # a derivation name that is not a str
    EntityState("w", "e", facts=[]),
], ids=["int-subclass", "frozenset", "not-a-fact", "huge-seq", "int-name", "facts-list"])
def test_shapes_left_to_the_python_writer(state):
    assert _ccodec.encode_body(state, False) is None
    try:
        expected = bytes(encode_body(state))
    except (TypeError, AttributeError) as exc:  # codec.py's own verdict on the shape
        with pytest.raises(type(exc)):
            encode_state(state)
    else:
        assert encode_state(state) == expected


def test_a_job_that_is_not_a_job_is_the_python_writers_error():
    state = EntityState("w", "e", ds={"d": DState(queued=Odd())})  # type: ignore[arg-type]
    assert _ccodec.encode_body(state, False) is None
    with pytest.raises(TypeError, match="not a Job"):
        encode_state(state)


def test_deflated_states_are_unchanged_and_decode():
    big = EntityState("w", "e", unready={i: [1784451600.0 + i, (0, 1)] for i in range(200)})
    data = encode_state(big)
    assert data[0] == codec.V1_DEFLATED
    assert decode_state(data, "w", "e") == big


def python_verdict(data: bytes, ws: Any, ent: Any) -> Any:
    try:
        return typed(codec.decode_body(data, ws, ent))
    except Exception as exc:  # noqa: BLE001 - any error: the C reader must defer
        return exc


def check_reader(data: bytes, ws: Any = "w", ent: Any = "e") -> None:
    """The C reader gives codec.py's state, or None; None whenever codec.py raises."""
    c = _ccodec.decode_body(data, ws, ent)
    py = python_verdict(data, ws, ent)
    if isinstance(py, Exception):
        assert c is None, f"C read {data!r}, which codec.py rejects: {py!r}"
    elif c is not None:
        assert typed(c) == py


@settings(max_examples=300, deadline=None)
@given(states(), st.data())
def test_damaged_bytes_are_left_to_codec_py(state, data):
    good = bytes(encode_body(state))
    check_reader(good, "ws", "ent")
    cut = data.draw(st.integers(1, max(1, len(good) - 1)))
    check_reader(good[:cut], "ws", "ent")
    pos = data.draw(st.integers(1, len(good) - 1)) if len(good) > 1 else 1
    flipped = bytearray(good)
    if pos < len(flipped):
        flipped[pos] = data.draw(st.integers(0, 255))
    check_reader(bytes(flipped), "ws", "ent")
    check_reader(good + data.draw(st.binary(min_size=1, max_size=3)), "ws", "ent")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60))
def test_arbitrary_bytes_are_read_alike_or_left_to_codec_py(tail):
    for head in (b"\x01\x00", b"\x01\x01", b"\x01\x04", b"\x01\x40", b"\x01\x02",
                 b"\x01\x20", b"\x01"):
        check_reader(head + tail)
        check_reader(head + tail, None, None)


def test_values_only_codec_py_reads_are_left_to_it():
    body = bytes(encode_body(EntityState("w", "e", unready={5: []})))
    assert _ccodec.decode_body(body, None, "e") is None  # no workspace: codec.py's error
    with pytest.raises(ValueError, match="workspace and entity"):
        decode_state(body, None, "e")
    assert _ccodec.decode_body(body, 7, "e") is None  # a workspace that is not a str
    assert codec.decode_body(body, 7, "e").workspace == 7
    assert _ccodec.decode_body(bytearray(body), "w", "e") is None
    assert decode_state(bytearray(body), "w", "e") == EntityState("w", "e", unready={5: []})


ROUNDS = 500


def test_no_memory_is_kept_between_calls():
    """Every object the writer touches is released: repeated encodes of a state with
    every path (big ints, job ids, back references, fallbacks) hold no memory."""
    state = EntityState("ws", "ent", unready={1: EDGES},
                        ds={"d": DState(w=3, queued=Job("ws/d/ent/12", {"r": 1.0}, 2.0))},
                        facts={1: Fact(1, "main", "k", False, True, "ab" * 8, True, 1.5, 1.0,
                                       (0, 1), {0: True})}, last_lsn=2**100)
    odd = EntityState("w", "e", unready={1: [1, "x", Sub(3)]})
    data = _ccodec.encode_body(state, True)
    bad = [data[:n] for n in range(1, len(data))] + [data + b"\x00"]

    assert typed(_ccodec.decode_body(data, None, None)) == typed(state)

    def once() -> None:
        _ccodec.encode_body(state, True)
        _ccodec.encode_body(odd, False)
        _ccodec.decode_body(data, None, None)
        for b in bad[::7]:
            _ccodec.decode_body(b, None, None)

    grown = bytes_kept(once, ROUNDS)
    # one object of 32 B kept per call would be 16,000 B
    assert grown < 8_000, f"{grown} bytes kept after {ROUNDS} rounds"
