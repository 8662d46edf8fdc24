"""The stored form of entity states (wakeline.core.codec): exact, compact, and the
previous JSON form still loads."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.core.helpers import derivation, sim_for
from tests.unit.core.test_state import DERIVS, random_history
from wakeline.core import codec
from wakeline.core.codec import decode_state, encode_state
from wakeline.core.plan import Fact
from wakeline.core.state import DState, EntityState, Job
from wakeline.testing import Transient


def typed(x: Any) -> Any:
    """``x`` with every type made visible: 1 != 1.0, (1,) != [1], 0.0 != -0.0, NaN == NaN."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, [(f.name, typed(getattr(x, f.name)))
                                   for f in dataclasses.fields(x)])
    if isinstance(x, float):
        return ("float", struct.pack("<d", x))
    if isinstance(x, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in x.items()])  # order too
    if isinstance(x, list | tuple):
        return (type(x).__name__, [typed(v) for v in x])
    return (type(x).__name__, x)


def assert_round_trips(state: EntityState) -> bytes:
    data = encode_state(state)
    back = decode_state(data, state.workspace, state.entity)
    assert back == state
    assert typed(back) == typed(state)
    assert encode_state(back) == data, "the form is canonical"
    with_id = encode_state(state, identity=True)
    assert typed(decode_state(with_id)) == typed(state)
    return data


# -- the previous form -------------------------------------------------------------------

#: Written by the previous worker: ``json.dumps(st.to_dict(), separators=(",", ":"))``.
OLD = (b'{"workspace":"default","entity":"user:mia","facts":[[3,"main",null,false,true,"",true,'
       b'1784451600.5,1784451600.5,[0,1],[[1,4.0],[3,true]]],[5,"profiles","role",false,true,'
       b'"2873c69a0d96a586",true,null,1784451660.25,[2],[[2,true]]]],"unready":[[7,1784451700.0,'
       b'[0]]],"ds":{"w":{"w":5,"last_success":1784451660.25,"handled":1784451660.25,'
       b'"last_run":1784451660.25,"total":3,"queued":{"id":"default/w/user:mia/2","reasons":'
       b'{"trigger:w.default:write":1784451760.25},"created":1784451700.0,"settle":[],"dedupe":'
       b'["cron:w:2026-07-19T09:00:00Z"],"dispatched":null},"running":null,"dead":false,'
       b'"jobs_made":2,"cron_last":{"w.nightly":1784430000.0},"waiting_on":7},"acc":{"w":0,'
       b'"last_success":null,"handled":null,"last_run":null,"total":1,"queued":null,"running":'
       b'null,"dead":true,"jobs_made":0,"cron_last":{},"waiting_on":null}},"census_base":[[4,2]],'
       b'"alerted":[7],"last_lsn":41}')

OLD_STATE = EntityState(
    "default", "user:mia",
    facts={3: Fact(3, "main", None, False, True, "", True, 1784451600.5, 1784451600.5, (0, 1),
                   {1: 4.0, 3: True}),
           5: Fact(5, "profiles", "role", False, True, "2873c69a0d96a586", True, None,
                   1784451660.25, (2,), {2: True})},
    unready={7: [1784451700.0, (0,)]},
    ds={"w": DState(5, 1784451660.25, 1784451660.25, 1784451660.25, 3,
                    Job("default/w/user:mia/2", {"trigger:w.default:write": 1784451760.25},
                        1784451700.0, [], ["cron:w:2026-07-19T09:00:00Z"], None),
                    None, False, 2, {"w.nightly": 1784430000.0}, 7),
        "acc": DState(total=1, dead=True)},
    census_base={4: 2}, alerted=[7], last_lsn=41)


def test_a_state_stored_by_the_previous_version_loads_equal():
    assert typed(decode_state(OLD)) == typed(OLD_STATE)
    # its own identity wins over the key's (they are the same in a real table)
    assert decode_state(OLD, "default", "user:mia") == OLD_STATE
    # the old writer's default separators too
    spaced = json.dumps(json.loads(OLD)).encode()
    assert typed(decode_state(spaced)) == typed(OLD_STATE)
    # and what the old form turns into now round-trips
    data = assert_round_trips(OLD_STATE)
    assert len(data) < len(OLD) / 4


def test_compact_form_has_a_version_byte_and_leaves_the_identity_to_the_key():
    data = encode_state(OLD_STATE)
    assert data[0] == codec.V1
    assert b"user:mia" not in data, "not in the job id either"
    with pytest.raises(ValueError, match="workspace and entity"):
        decode_state(data)
    assert decode_state(encode_state(OLD_STATE, identity=True)) == OLD_STATE


def test_empty_state():
    st_ = EntityState("w", "e")
    assert encode_state(st_) == bytes([codec.V1, 0])
    assert_round_trips(st_)


def _with_facts(n: int) -> EntityState:
    facts = {s: Fact(s, "main", None, False, True, "", True, 1784451600.0 + s / 7,
                     1784451600.0 + s / 7, (0, 1, 3), {1: float(s % 30)})
             for s in range(100, 100 + n)}
    return EntityState("default", "user:a", facts=facts, ds={"w": DState(total=n)},
                       last_lsn=100 + n)


def test_large_states_are_deflated_and_round_trip():
    data = assert_round_trips(_with_facts(200))
    assert data[0] == codec.V1_DEFLATED
    assert len(data) > codec.DEFLATE_OVER / 2


def test_states_up_to_the_threshold_are_stored_plain():
    """zlib's fixed cost (~15 us a call) is not paid for a few hundred bytes."""
    data = assert_round_trips(_with_facts(30))
    assert 256 < len(data) <= codec.DEFLATE_OVER
    assert data[0] == codec.V1


@pytest.mark.parametrize("data", [b"", b"\x07abc", bytes([codec.V1]), bytes([codec.V1, 1, 5]),
                                  bytes([codec.V1_DEFLATED, 1, 2, 3]),
                                  encode_state(OLD_STATE) + b"\x00",
                                  encode_state(OLD_STATE)[:-3]])
def test_corrupt_bytes_raise_value_error(data):
    with pytest.raises(ValueError):
        decode_state(data, "default", "user:mia")


def test_float_edge_cases_are_exact():
    values = [0.0, -0.0, 1.0, -3.0, 2.0 ** 53, -2.0 ** 60, 1e300, 5e-324, -5e-324,
              math.inf, -math.inf, math.nan, 1784451600.123456, 1784451600.123457, 0.1, -0.1,
              1784451600.123457]
    cron = {f"t{i}": v for i, v in enumerate(values)}
    st_ = EntityState("w", "e", ds={"d": DState(cron_last=cron, waiting_on=-7)})
    back = decode_state(encode_state(st_), "w", "e")
    assert typed(back) == typed(st_)  # NaN by its bits


def test_the_writers_inline_paths_keep_types_and_bits():
    """The fact and derivation-state writers take shortcuts for the common shapes (a
    shared drive tuple, an arrival equal to the creation instant, small ints, floats
    in a condition's entry); each must give what the general path gives."""
    drive = (0, 1, 3)
    a, b = 1784451600.25, float("1784451600.25")  # equal, distinct objects
    assert a is not b
    facts = {
        1: Fact(1, "main", None, False, True, "", True, b, a, drive, {0: True, 1: 4.5}),
        2: Fact(2, "main", None, False, True, "", True, -0.0, 0.0, drive, {0: 1, 1: 1.0}),
        3: Fact(3, "main", None, False, True, "", True, 0.0, -0.0, (0, 1, 3), {}),
        # equal to the shared tuple but not int-typed, and one that is int-typed
        4: Fact(4, "main", None, False, True, "", True, None, a, (False, True, 3),
                {0: (0, 1, 3), 70: False}),
        5: Fact(200, "other", "k", True, False, "abcdef0123", False, 7, 7.0, drive,
                {1: -0.0}),
    }
    ds = {"d": DState(w=5, last_success=a, handled=1, last_run=None, total=63),
          "e": DState(total=64, last_success=-0.0), "f": DState(total=True)}
    for f in facts.values():
        assert f.drive is drive or f.drive == drive or f.drive == (False, True, 3)
    assert_round_trips(EntityState("w", "e", facts=facts, ds=ds))


def test_state_after_consumption_is_small(tmp_path):
    sim = sim_for(tmp_path, {"w": derivation("w", "write: {}")})
    for _ in range(200):
        sim.write(entity="user:mia", collection="main", type="chat",
                  annotations={"mood_v1": {"valence": 0.0, "label": "calm"}})
    # ~10 of these bytes are the redelivery order (engine.order_of: the position, then
    # the record's seq), whatever the number of records consumed
    assert len(encode_state(sim.states["user:mia"])) < 50


# -- exactness over what the core produces -------------------------------------------------

MORE = {
    **DERIVS,
    "deb": derivation("deb", "write: {}\ndebounce_s: 30\nmax_wait_s: 90"),
    "rd": derivation("rd", "read: true\ncooldown_s: 60"),
    "cr": derivation("cr", "cron: {expr: '0 * * * *', entities: dirty}"),
}


def _checking(engine: Any, seen: list[int]) -> None:
    apply = engine.apply

    def checked(state: EntityState, event: Any, now: float) -> Any:
        step = apply(state, event, now)
        assert_round_trips(step.state)
        seen[0] += 1
        return step

    engine.apply = checked


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(5, 40), st.booleans())
def test_every_state_the_core_makes_round_trips(tmp_path_factory, seed, steps, failing):
    rnd = random.Random(seed)

    def fail(name: str, entity: str, attempt: int) -> BaseException | None:
        r = rnd.random()
        return Transient("flaky") if r < 0.3 else RuntimeError("broken") if r < 0.4 else None

    sim = sim_for(tmp_path_factory.mktemp("cat"), MORE, run_duration=rnd.choice([0.0, 45.0]),
                  fail=fail if failing else None)
    seen = [0]
    _checking(sim.engine, seen)
    random_history(sim, rnd, steps)
    for entity in ("user:mia", "user:b"):
        sim.write(entity=entity, collection="main", type="chat", content={"priority": 3},
                  scores={"importance": 11}, ready=rnd.random() < 0.8,
                  annotations={"mood_v1": {"valence": -0.5, "label": "x" * 40}})
    sim.advance(rnd.choice([5, 100, 4000]))
    assert seen[0] > 0
    for state in sim.states.values():
        assert_round_trips(state)


# -- exactness over arbitrary values --------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-70, 70),
    st.floats(allow_nan=False), st.floats(1.7e9, 1.8e9), st.sampled_from([0.0, -0.0, 16.0]),
    st.text(max_size=40), st.sampled_from(["main", "role", "2873c69a0d96a586", "ABCDEF12", ""]),
    st.text("0123456789abcdef", min_size=8, max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=20), st.lists(inner, max_size=20).map(tuple),
    st.dictionaries(st.one_of(st.integers(-5, 200), st.text(max_size=5)), inner, max_size=18)),
    max_leaves=30)
int_tuples = st.lists(st.integers(-3, 300), max_size=18).map(tuple)
seqs = st.one_of(st.integers(0, 2**40), st.integers(-5, 300))
instants = st.one_of(st.none(), st.floats(1.7e9, 1.8e9), st.integers(0, 2**33),
                     st.floats(allow_nan=False))


@st.composite
def facts(draw: Any) -> Fact:
    created = draw(instants)
    return Fact(draw(seqs), draw(st.sampled_from(["main", "profiles", "c" * 40])),
                draw(st.one_of(st.none(), st.text(max_size=8))), draw(st.booleans()),
                draw(st.booleans()), draw(st.sampled_from(["", "2873c69a0d96a586", "xyz"])),
                draw(st.booleans()),
                draw(st.one_of(st.just(created), instants)), created,
                draw(st.one_of(int_tuples, st.sampled_from([(0, 1, 3), (2,), ()]))),
                draw(st.dictionaries(st.integers(0, 40), values, max_size=4)))


@st.composite
def jobs(draw: Any, name: str) -> Job:
    jid = draw(st.one_of(st.integers(0, 10**6).map(lambda n: f"ws/{name}/ent/{n}"),
                         st.sampled_from([f"ws/{name}/ent/07", f"ws/{name}/ent/", "x",
                                          f"ws/{name}/other/3"])))
    return Job(jid, draw(st.dictionaries(st.text(max_size=30), st.floats(allow_nan=False),
                                         max_size=3)),
               draw(instants), draw(st.lists(st.text(max_size=10), max_size=3)),
               draw(st.lists(st.text(max_size=30), max_size=2)), draw(instants))


@st.composite
def dstates(draw: Any, name: str) -> DState:
    return DState(draw(seqs), draw(instants), draw(instants), draw(instants),
                  draw(st.integers(0, 2**33)),
                  draw(st.one_of(st.none(), jobs(name))), draw(st.one_of(st.none(), jobs(name))),
                  draw(st.booleans()), draw(st.integers(0, 300)),
                  draw(st.dictionaries(st.text(max_size=12), st.floats(allow_nan=False),
                                       max_size=3)),
                  draw(st.one_of(st.none(), seqs)))


@st.composite
def states(draw: Any) -> EntityState:
    fs = draw(st.lists(facts(), max_size=20))
    names = draw(st.lists(st.text(max_size=12), max_size=5, unique=True))
    return EntityState(
        "ws", "ent", {f.seq: f for f in fs},
        draw(st.dictionaries(seqs, st.tuples(instants, int_tuples).map(list), max_size=3)),
        {n: draw(dstates(n)) for n in names},
        draw(st.dictionaries(st.integers(0, 40), st.integers(0, 2**40), max_size=4)),
        draw(st.lists(seqs, max_size=4)), draw(st.one_of(st.integers(0, 2**64), st.just(0))))


@settings(max_examples=400, deadline=None)
@given(states())
def test_arbitrary_states_round_trip_exactly(state):
    assert_round_trips(state)


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=1, max_size=40))
def test_arbitrary_values_round_trip_exactly(vals):
    # more than 64 distinct strings and 16 distinct tuples: the long back references
    vals = vals + [f"s{i}" for i in range(70)] + [(i, i) for i in range(20)] + vals
    st_ = EntityState("w", "e", unready={1: vals})
    assert typed(decode_state(encode_state(st_), "w", "e")) == typed(st_)


def test_the_api_state_view_decodes_both_forms():
    from wakeline.api.state_view import StateView

    view = StateView("localhost:1", "app")  # not started: no broker needed
    new = EntityState("default", "user:b", ds={"w": DState(
        3, queued=Job("default/w/user:b/4", {"manual": 10.0}, 10.0))})
    view._states = {"default\x1fuser:mia": OLD, "default\x1fuser:b": encode_state(new),
                    "default\x1fuser:bad": b"\x09junk"}
    assert sorted(s.entity for s in view.states()) == ["user:b", "user:mia"]
    assert view.state("default", "user:mia") == OLD_STATE
    assert view.state("default", "user:b") == new
    found = view.find_job("default/w/user:b/4")
    assert found is not None and found[1:3] == ("w", "queued")
    assert view.find_job("default/w/user:mia/2")[2] == "queued"

