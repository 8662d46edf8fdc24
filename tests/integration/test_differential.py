"""Differential tests: the condition core (``Simulator.evaluate``) against the SQL oracle.

Hypothesis generates small random catalogs (an event collection with scorers, a
required annotator and declared fields of every filterable type across two versions
with different bindings; two keyed collections; one or two derivations with random
triggers and options) and short random histories (ready and unready writes with
random content — including missing values, wrong types and nulls — mark_ready in
random order, keyed rewrites identical and different, retractions, in-place updates,
deletions, manual runs, clock moves).  After every step the simulator's state is
mirrored into PostgreSQL and, for every trigger condition and every entity, the core
and :mod:`tests.oracle.sql` must agree on ``holds`` and ``value`` (and, for changed
and retraction, on the set of transitions).

One test per condition kind, each focused on that kind (the first trigger always
carries it; other conditions appear at random and are checked too).
``WAKELINE_DIFF_EXAMPLES`` sets the examples per kind (default 500; about three
minutes for all eight on a quiet two-core machine); ``WAKELINE_DIFF_STATS=1`` prints
how many evaluations were compared per kind, holding or not.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from hypothesis import HealthCheck, given, note, reject, settings
from hypothesis import strategies as st

from tests.oracle.mirror import mirror
from tests.oracle.sql import Oracle, install
from wakeline.catalog import CatalogInvalid, compile_catalog
from wakeline.clock import parse_instant
from wakeline.store import migrate
from wakeline.testing import Simulator, SimulatorError

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("WAKELINE_DIFF_EXAMPLES", "500"))
START = "2026-01-01T00:00:00Z"
ENTITIES = ("u:a", "u:b")

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.filter_too_much, HealthCheck.data_too_large],
    print_blob=True,
)

# -- the collections ------------------------------------------------------------------------

_STR_ARRAY = {"type": "array", "items": "string"}
_NUM_ARRAY = {"type": "array", "items": "number"}
_DT_ARRAY = {"type": "array", "items": "datetime"}

_EV_V1 = {
    "n": "number", "i": "integer", "s": "string", "b": "boolean", "d": "datetime",
    "tags": _STR_ARRAY, "nums": _NUM_ARRAY,
    "val": {"annotation": "sent", "path": "valence"},
    "lab": {"annotation": "sent", "path": "label"},
    "obj": {"type": "object"},
}
# v2 moves n and d (per-version bindings), widens i to number, adds an array of datetimes.
_EV_V2 = {
    **_EV_V1,
    "n": {"type": "number", "content": "m.n"},
    "i": "number",
    "d": {"type": "datetime", "content": "when"},
    "dts": _DT_ARRAY,
}
_KV = {"n": "number", "i": "integer", "s": "string", "b": "boolean", "d": "datetime",
       "tags": _STR_ARRAY, "nums": _NUM_ARRAY}
_KV2 = {"n": "number", "s": "string", "d": "datetime"}

#: (collection, version) → {field: (type, items)} as the generator understands them.
FIELDS: dict[tuple[str, int], dict[str, tuple[str, str | None]]] = {}


def _types(fields: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    out = {}
    for name, decl in fields.items():
        if isinstance(decl, str):
            out[name] = (decl, None)
        elif "annotation" in decl:
            out[name] = ({"valence": "number", "label": "string"}[decl["path"]], None)
        elif decl["type"] != "object":
            out[name] = (decl["type"], decl.get("items"))
    return out


FIELDS[("ev", 1)] = _types(_EV_V1)
FIELDS[("ev", 2)] = _types(_EV_V2)
FIELDS[("kv", 1)] = _types(_KV)
FIELDS[("kv2", 1)] = _types(_KV2)
KEYED = {"ev": False, "kv": True, "kv2": True}
KEYS = {"kv": ("k1", "k2"), "kv2": ("a", "b")}
TYPES = {"ev": ("chat", "note"), "kv": ("", "pref"), "kv2": ("", "pref")}


def collections_docs(ev_active: int) -> dict[str, dict[str, Any]]:
    return {
        "ev": {
            "name": "ev", "types": ["chat", "note"], "scorers": ["imp", "urg"],
            "annotators": [{"name": "sent", "required": True,
                            "leaves": {"valence": "number", "label": "string"}}],
            "active_version": ev_active,
            "versions": [{"version": 1, "fields": _EV_V1}, {"version": 2, "fields": _EV_V2}],
        },
        "kv": {"name": "kv", "keyed": True, "fields": _KV},
        "kv2": {"name": "kv2", "keyed": True, "keys": ["a", "b", "c"], "fields": _KV2},
    }


FUNCTIONS = '''
def noop(ctx):
    return []


def emit_kv2(ctx):
    """A keyed value in kv2 whose content follows the input (identical reruns are
    byte-identical rewrites)."""
    return [{"collection": "kv2", "key": "c", "content": {"n": len(ctx.records) % 2}}]
'''

# -- value pools ------------------------------------------------------------------------------

NUMBERS = [-1, 0, 0.5, 1, 2, 2.5, 3, 10, 2.0]
WRONG = [True, False, None, "2", [1], {"x": 1}]
INTEGERS = [0, 1, 2, 3, 2.0, 2.5]
STRINGS = ["a", "b", "B", "ab", "é", "z", ""]
BOOLEANS = [True, False]
#: Instants near START, written in several valid ISO-8601 forms with a zone.
DATETIMES = [
    "2026-01-01T00:10:00Z", "2026-01-01T01:00:00+01:00", "2026-01-01T00:05:00.5Z",
    "2026-01-01T00:30:00-02:00", "2025-12-31T23:59:00Z", "2026-01-01T02:00:00Z",
    "2026-01-01T00:00:30Z", "2026-01-01T00:20:00+00:00", "2026-01-01T00:01:00Z",
]
#: Other instants with a zone in RFC 3339 / ISO basic spellings.
ODD_DATETIMES = ["2026-01-01 00:10:00Z", "2026-01-01t00:10:00z", "20260101T001000Z",
                 "2026-01-01T00:10:00+0100", "2026-01-01T00:10:00+01"]
#: Strings that are not instants, each of which must fail (no zone: not an instant).
BAD_DATETIMES = ["not a date", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "now",
                 "2026-01-01T24:00:00Z", "2026-01-01T00:10:00", "2026-01-01",
                 "2026-01-01 00:30",
                 # outside the grammar of docs/semantics.md although Python parses them
                 "2026-W01-4T00:10:00Z", "2026-01-01T00Z", " 2026-01-01T00:10:00Z",
                 "2026-01-01T00:10:00.1234567Z"]

SCALAR_POOLS: dict[str, list[Any]] = {
    "number": NUMBERS, "integer": INTEGERS, "string": STRINGS, "boolean": BOOLEANS,
    "datetime": DATETIMES,
}


def _with_wrong(pool: list[Any], wrong: list[Any]) -> st.SearchStrategy[Any]:
    """Mostly values from ``pool``, about 1 in 4 from ``wrong`` (one draw)."""
    k = max(1, math.ceil(3 * len(wrong) / len(pool)))
    return st.sampled_from(list(pool) * k + list(wrong))


# Strategies are built once: constructing them per draw dominates generation time.
@functools.cache
def scalar_values(type_: str) -> st.SearchStrategy[Any]:
    wrong = list(WRONG)
    if type_ == "datetime":
        wrong += ODD_DATETIMES + BAD_DATETIMES + [1767225600]
    if type_ in ("number", "integer"):
        wrong += [True]
    if type_ == "string":
        wrong += [1]
    if type_ == "boolean":
        wrong += [0, 1, "true"]
    return _with_wrong(SCALAR_POOLS[type_], wrong)


@functools.cache
def array_values(items: str) -> st.SearchStrategy[Any]:
    good = st.lists(st.sampled_from(SCALAR_POOLS[items][:4]), max_size=3)
    bad = st.sampled_from([None, "a", 1, [None], ["a", 1], [True], {"a": 1}])
    return st.one_of(good, good, good, bad)


def field_value(type_: str, items: str | None) -> st.SearchStrategy[Any]:
    return array_values(items) if type_ == "array" else scalar_values(type_)  # type: ignore[arg-type]


@functools.cache
def contents(collection: str, version: int | None = None) -> st.SearchStrategy[dict[str, Any]]:
    return _contents(collection, version)


@st.composite
def _contents(draw: st.DrawFn, collection: str, version: int | None) -> dict[str, Any]:
    """Content for a record of ``collection``: most declared fields, usually at the
    paths ``version`` binds, sometimes at the other version's (so a row may carry a
    value its own version does not bind)."""
    if collection == "ev":
        fields = {**FIELDS[("ev", 1)], **FIELDS[("ev", 2)]}
        fields = {k: v for k, v in fields.items() if k not in ("val", "lab")}
    else:
        fields = FIELDS[(collection, 1)]
    out: dict[str, Any] = {}
    paths = {1: ("n", "d"), 2: ("m.n", "when")}.get(version or 0)
    for name, (type_, items) in sorted(fields.items()):
        if draw(st.integers(0, 3)) == 0:
            continue
        value = draw(field_value(type_, items))
        if collection == "ev" and name == "n":
            where = (paths[0] if paths and draw(st.integers(0, 3)) else
                     draw(st.sampled_from(["n", "m.n", "both"])))
            if where in ("n", "both"):
                out["n"] = value
            if where in ("m.n", "both"):
                out["m"] = draw(st.sampled_from([{"n": value}, {"n": value}, 5, {}]))
        elif collection == "ev" and name == "d":
            out[paths[1] if paths and draw(st.integers(0, 3)) else
                draw(st.sampled_from(["d", "when"]))] = value
        else:
            out[name] = value
    if draw(st.booleans()):
        out["obj"] = {"x": draw(st.sampled_from([1, 1.0, "1"]))}
    return out


SCORE_VALUES = [0, 1, 2.5, 5, -1, 0.25, 10]
VALENCES = [-1, -0.5, 0, 0.25, 1, 0.75]
LABELS = ["pos", "neg", "pos", 1, 1.0, True, False, 0]


_SCORE = _with_wrong(SCORE_VALUES, [True, "3", None])
_VALENCE = _with_wrong(VALENCES, [True, "x", None])
_LABEL = _with_wrong(LABELS, [None, [1], {"a": 1}])


@st.composite
def scores(draw: st.DrawFn) -> dict[str, Any]:
    out = {}
    for name in ("imp", "urg"):
        if draw(st.integers(0, 3)):
            out[name] = draw(_SCORE)
    return out


@st.composite
def annotations(draw: st.DrawFn) -> dict[str, Any]:
    shape = draw(st.integers(0, 6))
    if shape == 0:
        return {}
    if shape == 1:
        return {"sent": draw(st.sampled_from([None, 3, "x"]))}
    sent: dict[str, Any] = {}
    if draw(st.integers(0, 3)):
        sent["valence"] = draw(_VALENCE)
    if draw(st.integers(0, 3)):
        sent["label"] = draw(_LABEL)
    return {"sent": sent}


SCORES = scores()
ANNOTATIONS = annotations()

# -- catalogs ----------------------------------------------------------------------------------

KINDS = ("write", "changed", "retraction", "accumulator", "census", "lifecycle", "quiet", "at")
SOURCE_CHOICES = ("ev", "ev@1", "ev@2", "kv", "kv2")


def _ref(text: str, ev_active: int) -> tuple[str, int]:
    name, _, version = text.partition("@")
    return (name, int(version) if version else (ev_active if name == "ev" else 1))


def _subset(draw: st.DrawFn, pool: list[Any] | tuple[Any, ...], *, min_size: int = 1
            ) -> list[Any]:
    return draw(st.lists(st.sampled_from(sorted(set(pool))), min_size=min_size,
                         max_size=len(set(pool)), unique=True))


def _common_fields(refs: list[tuple[str, int]]) -> dict[str, tuple[str, str | None]]:
    """Fields every ref declares with one compatible type (integer/number merge)."""
    common: dict[str, tuple[str, str | None]] | None = None
    for ref in refs:
        fields = FIELDS[ref]
        if common is None:
            common = dict(fields)
            continue
        merged = {}
        for name, t in common.items():
            if name not in fields:
                continue
            u = fields[name]
            if t == u:
                merged[name] = t
            elif {t[0], u[0]} == {"integer", "number"}:
                merged[name] = ("number", None)
        common = merged
    return common or {}


def _operand(draw: st.DrawFn, op: str, type_: str, items: str | None) -> Any:
    if op == "exists":
        return draw(st.booleans())
    if type_ == "array":
        assert items is not None
        pool = SCALAR_POOLS[items][:5]
        if op == "eq":
            return draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
        return draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
    pool = [v for v in SCALAR_POOLS[type_]
            if not (type_ == "integer" and isinstance(v, float))]
    if op == "in":
        return draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
    return draw(st.sampled_from(pool))


def _ops(type_: str) -> list[str]:
    if type_ == "array":
        return ["exists", "eq", "contains_any", "contains_all"]
    if type_ == "boolean":
        return ["exists", "eq", "in"]
    return ["exists", "eq", "in", "gt", "gte", "lt", "lte"]


@st.composite
def wheres(draw: st.DrawFn, refs: list[tuple[str, int]]) -> dict[str, Any]:
    fields = _common_fields(refs)
    out: dict[str, Any] = {}
    if not fields:
        return out
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        name = draw(st.sampled_from(sorted(fields)))
        type_, items = fields[name]
        spec = out.setdefault(name, {})
        ops = [draw(st.sampled_from(_ops(type_)))]
        if draw(st.integers(0, 3)) == 0:
            ops.append(draw(st.sampled_from(_ops(type_))))
        for op in ops:
            spec[op] = _operand(draw, op, type_, items)
    return out


@st.composite
def sources(draw: st.DrawFn, ev_active: int, need_keyed: bool, need_ev: bool
            ) -> dict[str, Any]:
    colls = _subset(draw, SOURCE_CHOICES)
    if need_keyed and not any(c.startswith("kv") for c in colls):
        colls.append(draw(st.sampled_from(["kv", "kv2"])))
    if need_ev and not any(c.startswith("ev") for c in colls):
        colls.append(draw(st.sampled_from(["ev", "ev@1", "ev@2"])))
    # "ev" and its active "ev@N" name the same version: keep one
    if "ev" in colls and f"ev@{ev_active}" in colls:
        colls.remove("ev")
    src: dict[str, Any] = {"collections": sorted(colls)}
    names = {_ref(c, ev_active)[0] for c in colls}
    if draw(st.integers(0, 3)) == 0:
        types = [t for n in sorted(names) for t in TYPES[n] if t]
        src["types"] = _subset(draw, types)
        if any(n.startswith("kv") for n in names) and draw(st.integers(0, 3)):
            src["types"].append("")
    if draw(st.integers(0, 3)) == 0:
        src["statuses"] = _subset(draw, ["active", "archived"])
    src["mode"] = draw(st.sampled_from(["changes", "changes", "snapshot", "current"]))
    return src


@st.composite
def scope_spec(draw: st.DrawFn, kind: str, src: dict[str, Any], ev_active: int
               ) -> dict[str, Any] | None:
    consuming = kind in ("write", "changed", "retraction", "quiet")
    keyed_only = kind in ("changed", "retraction")
    src_colls = src["collections"]
    if consuming:
        pool = [c for c in src_colls if not keyed_only or c.startswith("kv")]
    else:
        pool = ["ev", "ev@1", "ev@2", "kv", "kv2"]
    if not pool:
        return None
    spec: dict[str, Any] = {}
    inherit = draw(st.integers(0, 2)) == 0 and not (keyed_only and len(pool) < len(src_colls))
    if not inherit:
        colls = _subset(draw, pool)
        if "ev" in colls and f"ev@{ev_active}" in colls:
            colls.remove("ev")
        spec["collections"] = colls
    colls = spec.get("collections", src_colls)
    refs = sorted({_ref(c, ev_active) for c in colls})
    names = {r[0] for r in refs}
    if draw(st.integers(0, 3)) == 0:
        if consuming and "types" in src:
            spec["types"] = _subset(draw, src["types"])
        else:
            types = [t for n in sorted(names) for t in TYPES[n] if t]
            if "kv" in names or "kv2" in names:
                types.append("")
            spec["types"] = _subset(draw, types)
    if draw(st.integers(0, 3)) == 0:
        pool_st = src.get("statuses", ["active", "archived"]) if consuming else [
            "active", "archived"]
        spec["statuses"] = _subset(draw, pool_st)
    where = draw(wheres(refs))
    if where:
        spec["where"] = where
    return spec


DYADIC = [0.25, 0.5, 1, 1.5, 2, 2.5, 3, 4, 5, 7.5, 10]


@st.composite
def windows(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.integers(0, 2)):
        return None
    size = draw(st.sampled_from([10, 60, 120, 600, 3600]))
    w: dict[str, Any] = {"size_s": size}
    if draw(st.booleans()):
        w["hop_s"] = draw(st.sampled_from([h for h in (1, 5, 30, 60, 600) if h <= size]))
    return w


@st.composite
def condition(draw: st.DrawFn, kind: str, src: dict[str, Any], ev_active: int) -> Any:
    if kind in ("write", "retraction"):
        return draw(scope_spec(kind, src, ev_active))
    if kind == "changed":
        spec = draw(scope_spec(kind, src, ev_active))
        if spec is None:
            return None
        if draw(st.integers(0, 2)) == 0:
            spec["keys"] = _subset(draw, ["k1", "k2", "a", "b"])
        if draw(st.integers(0, 1)) == 0:
            spec["transitions"] = _subset(draw, ["added", "changed", "removed"])
        return spec
    if kind == "quiet":
        spec = draw(scope_spec(kind, src, ev_active))
        if spec is None:
            return None
        spec["after_s"] = draw(st.sampled_from([1, 5, 30, 120, 600]))
        if draw(st.integers(0, 2)) == 0:
            spec["max_wait_s"] = spec["after_s"] * draw(st.sampled_from([1, 2, 5]))
        return spec
    if kind == "at":
        spec = draw(scope_spec(kind, src, ev_active))
        assert spec is not None
        spec["field"] = "d"
        spec["offset_s"] = draw(st.sampled_from([0, 0, -3600, -60, 30, 600]))
        return spec
    if kind == "census":
        spec = draw(scope_spec(kind, src, ev_active))
        assert spec is not None
        spec["threshold"] = draw(st.sampled_from([1, 1, 2, 3]))
        w = draw(windows())
        if w:
            spec["window"] = w
        return spec
    if kind == "lifecycle":
        spec = {}
        form = draw(st.sampled_from(["first", "total", "both"]))
        if form in ("first", "both"):
            spec["first_record"] = True
        if form in ("total", "both"):
            spec["total_records"] = draw(st.integers(1, 6))
        return spec
    assert kind == "accumulator"
    has_ev = any(c.startswith("ev") for c in src["collections"])
    forms = ["count", "scorer", "scorer_agg", "annotation"] if has_ev else ["count"]
    form = draw(st.sampled_from(forms))
    aggs = ["sum", "count", "avg", "max", "min", "distinct_count"]
    if form == "count":
        metric: Any = "count"
    elif form == "scorer":
        metric = draw(st.sampled_from(["imp", "urg"]))
    elif form == "scorer_agg":
        metric = {"scorer": draw(st.sampled_from(["imp", "urg"])),
                  "aggregate": draw(st.sampled_from(aggs))}
    else:
        path = draw(st.sampled_from(["valence", "label"]))
        agg = draw(st.sampled_from(aggs if path == "valence" else ["count", "distinct_count"]))
        metric = {"annotation": "sent", "path": path, "aggregate": agg}
    comparison = draw(st.sampled_from(["gte", "gte", "lte"]))
    threshold = draw(st.sampled_from(DYADIC))
    if comparison == "lte":
        threshold = draw(st.sampled_from([threshold, -threshold, 0]))
    spec = {"metric": metric, "threshold": threshold}
    if comparison == "lte" or draw(st.booleans()):
        spec["comparison"] = comparison
    w = draw(windows())
    if w:
        spec["window"] = w
    return spec


@st.composite
def trigger_body(draw: st.DrawFn, focus: str | None, src: dict[str, Any], ev_active: int
                 ) -> dict[str, Any] | None:
    kinds = [k for k in KINDS if k != focus and draw(st.integers(0, 6)) == 0]
    if focus is not None:
        kinds.insert(0, focus)
    body: dict[str, Any] = {}
    for kind in kinds:
        spec = draw(condition(kind, src, ev_active))
        if spec is None:
            if kind == focus:
                return None
            continue
        body[kind] = spec
    if not body:
        body["write"] = {}
    # pacing keeps stimuli from running at once, so pending rows pile up and the
    # conditions get compared in their holding states too
    if draw(st.integers(0, 2)) > 0:
        body["cooldown_s"] = draw(st.sampled_from([5, 60, 600, 3600]))
    data = set(body) & {"write", "changed", "retraction", "accumulator", "census", "lifecycle"}
    if data and draw(st.integers(0, 2)) == 0:
        body["debounce_s"] = draw(st.sampled_from([5, 60]))
        if draw(st.booleans()):
            body["max_wait_s"] = body["debounce_s"] * 3
    return body


@st.composite
def catalogs(draw: st.DrawFn, focus: str) -> dict[str, Any]:
    ev_active = draw(st.sampled_from([1, 2]))
    spec: dict[str, Any] = {"ev_active": ev_active, "derivations": [], "triggers": []}
    for i in range(draw(st.integers(1, 2))):
        mine = focus if i == 0 else None
        src = draw(sources(ev_active, need_keyed=mine in ("changed", "retraction"),
                           need_ev=mine == "accumulator" and draw(st.booleans())))
        name = f"d{i}"
        emits = []
        if i == 1 and draw(st.integers(0, 2)) == 0:
            emits = ["kv2"]
        doc: dict[str, Any] = {"name": name, "source": src,
                               "function": "wlfn:emit_kv2" if emits else "wlfn:noop",
                               "emits": emits}
        body = draw(trigger_body(mine, src, ev_active))
        if body is None:
            reject()
        doc["trigger"] = body
        spec["derivations"].append(doc)
        for j in range(draw(st.integers(0, 1))):
            extra = draw(trigger_body(None, src, ev_active))
            if extra:
                spec["triggers"].append({"name": f"{name}.extra{j}", "processor": name,
                                         **extra})
    return spec


@functools.cache
def _collection_files(ev_active: int) -> tuple[tuple[str, str], ...]:
    return tuple((f"collections/{name}.yaml", yaml.safe_dump(doc))
                 for name, doc in collections_docs(ev_active).items())


def write_catalog(root: Path, spec: dict[str, Any]) -> None:
    """Write ``spec`` under ``root``: changed files only, stale ones removed."""
    files = dict(_collection_files(spec["ev_active"]))
    files.update({f"derivations/{doc['name']}.yaml": yaml.safe_dump(doc)
                  for doc in spec["derivations"]})
    files.update({f"triggers/{doc['name']}.yaml": yaml.safe_dump(doc)
                  for doc in spec["triggers"]})
    files["wlfn.py"] = FUNCTIONS
    for sub in ("collections", "derivations", "triggers"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for old in (root / sub).iterdir():
            if f"{sub}/{old.name}" not in files:
                old.unlink()
    for rel, text in files.items():
        path = root / rel
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


# -- histories ------------------------------------------------------------------------------------

ADVANCES = [1, 5, 30, 61, 300, 900, 3600]


@st.composite
def steps(draw: st.DrawFn) -> tuple[Any, ...]:
    op = draw(st.sampled_from(["event", "event", "event", "keyed", "keyed", "keyed", "keyed",
                               "ready", "ready", "retract", "retract", "retract", "update",
                               "delete", "manual", "advance", "advance"]))
    entity = draw(st.sampled_from(ENTITIES))
    if op == "event":
        version = draw(st.sampled_from([None, 1, 2]))
        return ("event", entity, version, draw(st.sampled_from(TYPES["ev"])),
                draw(st.sampled_from(["active", "active", "active", "archived"])),
                draw(contents("ev", version)), draw(SCORES), draw(ANNOTATIONS),
                draw(st.integers(0, 2)) > 0, draw(st.text("ab", max_size=2)))
    if op == "keyed":
        coll = draw(st.sampled_from(["kv", "kv", "kv2"]))
        # a new value, the head's value byte-identically, or the head's value with
        # obj.x toggled between 1 and 1.0 (equal numbers, different canonical JSON)
        mode = draw(st.sampled_from(["new", "new", "same", "near"]))
        return ("keyed", entity, coll, draw(st.sampled_from(KEYS[coll])),
                draw(st.sampled_from(TYPES[coll])),
                draw(st.sampled_from(["active", "active", "active", "archived"])),
                draw(contents(coll)) if mode == "new" else mode,
                draw(st.text("ab", max_size=1)), draw(st.integers(0, 3)) > 0)
    if op == "ready":
        return ("ready", draw(st.integers(0, 7)),
                draw(SCORES) if draw(st.booleans()) else None,
                draw(ANNOTATIONS) if draw(st.booleans()) else None)
    if op == "retract":
        return ("retract", draw(st.integers(0, 7)))
    if op == "update":
        what = draw(st.sampled_from(["content", "status", "type"]))
        if what == "content":
            value: Any = draw(st.sampled_from(["ev", "kv", "kv2"]))
        elif what == "status":
            value = draw(st.sampled_from(["active", "archived"]))
        else:
            value = draw(st.sampled_from(["chat", "note", "", "pref"]))
        return ("update", draw(st.integers(0, 15)), what, value,
                draw(contents(value)) if what == "content" else None)
    if op == "delete":
        return ("delete", draw(st.integers(0, 15)))
    if op == "manual":
        return ("manual", draw(st.sampled_from(["d0", "d1"])), entity)
    return ("advance", draw(st.sampled_from(ADVANCES)))


def apply_step(sim: Simulator, step: tuple[Any, ...]) -> str | None:
    """Apply one step; return a description (None when it did not apply)."""
    step = copy.deepcopy(step)  # generated values may share nested lists/dicts
    op = step[0]
    if op == "event":
        _, entity, version, type_, status, content, sc, ann, ready, text = step
        seq = sim.write(entity=entity, collection="ev", version=version, type=type_,
                        status=status, content=content, text=text, scores=sc,
                        annotations=ann, ready=ready)
    elif op == "keyed":
        _, entity, coll, key, type_, status, content, text, ready = step
        if content in ("same", "near"):
            head = sim.head(entity, coll, key)
            if head is None or head.tombstone:
                content = {}
            else:
                content, text = dict(head.content), head.text
                if step[6] == "near":
                    x = content.get("obj", {}).get("x") if isinstance(
                        content.get("obj"), dict) else None
                    content["obj"] = {"x": 1.0 if x == 1 and isinstance(x, int) else 1}
        seq = sim.write(entity=entity, collection=coll, key=key, type=type_, status=status,
                        content=content, text=text, ready=ready)
    elif op == "ready":
        unready = sorted(s for s, r in sim.records.items() if not r.ready)
        if not unready:
            return None
        seq = unready[step[1] % len(unready)]
        sim.mark_ready(seq, scores=step[2], annotations=step[3])
    elif op == "retract":
        live = sorted({(sim._entity_of[s], r.collection, r.key) for s, r in sim.records.items()
                       if r.key is not None})
        live = [x for x in live if (h := sim.head(*x)) is not None and not h.tombstone]
        if not live:
            return None
        entity, coll, key = live[step[1] % len(live)]
        seq = sim.retract(entity=entity, collection=coll, key=key)
    elif op == "update":
        _, pick, what, value, content = step
        rows = sorted(s for s, r in sim.records.items() if not r.tombstone)
        if not rows:
            return None
        seq = rows[pick % len(rows)]
        if what == "content":
            sim.update(seq, content=content)
        else:
            sim.update(seq, **{what: value})
    elif op == "delete":
        rows = sorted(sim.records)
        if not rows:
            return None
        seq = rows[step[1] % len(rows)]
        sim.delete(seq)
    elif op == "manual":
        if step[1] not in sim.catalog.derivations:
            return None
        sim.manual(step[1], step[2])
        return f"manual({step[1]}, {step[2]})"
    else:
        sim.advance(step[1])
        return f"advance({step[1]}) -> {sim.now.isoformat()}"
    return f"{step!r} -> seq {seq}"


# -- comparison -----------------------------------------------------------------------------------


def _same_value(kind: str, core: Any, ref: Any) -> bool:
    if core is None or ref is None:
        return core is None and ref is None
    if kind in ("accumulator", "at"):
        return math.isclose(float(core), float(ref), rel_tol=1e-12, abs_tol=1e-6)
    return bool(core == ref)


def _epoch(value: Any) -> float | None:
    if value is None or isinstance(value, int | float):
        return value
    return parse_instant(value).timestamp()


def _transitions(detail: Any) -> set[tuple[int, str, str]] | None:
    if not isinstance(detail, dict) or "transitions" not in detail:
        return None
    out = set()
    for t in detail["transitions"]:
        if isinstance(t, dict):
            out.add((t["seq"], t["key"], t["transition"]))
        else:
            out.add((t[0], t[1], t[2]))
    return out


def compare(sim: Simulator, conn: psycopg.Connection[Any], oracle: Oracle,
            log: list[str], checked: dict[str, int]) -> None:
    entities = sorted(set(sim._entity_of.values()))
    if not entities:
        return
    # one round trip: mirror (committed; synchronous_commit is off) then evaluate, in a
    # pipeline.  Committing is faster than rolling back: a query right after a
    # rolled-back reload pays for the aborted tuples.
    with conn.pipeline():
        with conn.transaction():
            mirror(conn, sim)
        answers = oracle.run(conn, sim.now, entities)
    for trigger in oracle.triggers:
        conds = [k for k in sim.catalog.triggers[trigger].conditions
                 if k.kind not in ("cron", "read")]
        for entity in entities:
            core = sim.evaluate(trigger, entity)
            ref = answers[(trigger, entity)]
            assert [c["kind"] for c in core] == [r["kind"] for r in ref], (core, ref)
            for c, r, cond in zip(core, ref, conds, strict=True):
                for tally in (f"{c['kind']}:{'holds' if r['holds'] else 'not'}",
                              f"{c['kind']}:{'valued' if r['value'] else 'zero'}"):
                    checked[tally] = checked.get(tally, 0) + 1
                problems = []
                if c["holds"] != r["holds"]:
                    problems.append("holds")
                if c["kind"] == "quiet" and r["detail"]["armed"] and not _same_value(
                        "at", _epoch(c["detail"].get("settles_at")), r["detail"]["settles_at"]):
                    problems.append("settles_at")
                if not _same_value(c["kind"], c["value"], r["value"]):
                    problems.append("value")
                if c["kind"] in ("changed", "retraction"):
                    ct, rt = _transitions(c["detail"]), _transitions(r["detail"])
                    if ct is not None and ct != rt:
                        problems.append("transitions")
                if problems:
                    cursors = {d: sim.cursor(d, entity) for d in sim.catalog.derivations}
                    raise AssertionError(
                        f"core and oracle disagree on {', '.join(problems)} for {trigger} "
                        f"{c['kind']} entity={entity} at {sim.now.isoformat()}\n"
                        f"  core:   holds={c['holds']} value={c['value']!r} "
                        f"detail={c['detail']!r}\n"
                        f"  oracle: holds={r['holds']} value={r['value']!r} "
                        f"detail={r['detail']!r}\n"
                        f"  condition: {cond.model_dump_json()}\n"
                        f"  cursors: {cursors}\n"
                        f"  history:\n    " + "\n    ".join(log) + "\n  records:\n    "
                        + "\n    ".join(f"{s} {sim._entity_of[s]} {r!r}"
                                        for s, r in sorted(sim.records.items())))


# -- fixtures and the tests ----------------------------------------------------------------


@pytest.fixture
def diff_db(pg_dsn: str) -> Any:
    """One connection to a fresh migrated database, reused by every hypothesis example
    of the test (function-scoped fixtures are not reset between examples; every step
    reloads both tables, so nothing leaks from one example to the next)."""
    migrate(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        install(conn)
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("SET synchronous_commit = off")
        encoding = conn.execute("SHOW server_encoding").fetchone()
        assert encoding is not None and encoding[0] == "UTF8"  # code-point string order
        yield conn


@pytest.fixture
def catalog_root(tmp_path: Path) -> Path:
    return tmp_path / "catalog"


#: focus kind → {"<kind>:holds|not|valued|zero": evaluations compared, by the oracle's
#: holds and whether its value was non-zero/non-None}
COUNTS: dict[str, dict[str, int]] = {}


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Any:
    """WAKELINE_DIFF_STATS=1 prints how many evaluations were compared, per kind."""
    yield
    if os.environ.get("WAKELINE_DIFF_STATS") == "1":
        for focus, tallies in sorted(COUNTS.items()):
            print(f"\n{focus}: " + ", ".join(f"{k}={v}" for k, v in sorted(tallies.items())))


#: spec (canonical JSON) → (compiled catalog or None, its oracle): compiling is
#: deterministic, and hypothesis often replays a catalog with a mutated history.
_COMPILED: dict[str, tuple[Any, Oracle | None]] = {}


def run_differential(conn: psycopg.Connection[Any], root: Path, focus: str,
                     spec: dict[str, Any], history: list[tuple[Any, ...]],
                     run_duration: float) -> None:
    key = json.dumps(spec, sort_keys=True)
    if key not in _COMPILED:
        write_catalog(root, spec)
        try:
            catalog = compile_catalog(root)
        except CatalogInvalid as exc:
            catalog = None
            note(str(exc))
        if len(_COMPILED) > 256:
            _COMPILED.clear()
        _COMPILED[key] = (catalog, None if catalog is None else
                          Oracle(catalog, "default"))
    catalog, oracle = _COMPILED[key]
    if catalog is None or oracle is None:
        reject()
    if not any(c.kind == focus for t in catalog.triggers.values() for c in t.conditions):
        reject()
    note(yaml.safe_dump(spec, sort_keys=False))
    sim = Simulator(catalog, start=START, run_duration=run_duration)
    assert sim.workspace == oracle.workspace
    log: list[str] = []
    checked = COUNTS.setdefault(focus, {})
    for step in history:
        try:
            done = apply_step(sim, step)
        except SimulatorError as exc:  # a step the simulator refuses is not a finding
            log.append(f"{step!r} refused: {exc}")
            continue
        if done is None:
            continue
        log.append(done)
        compare(sim, conn, oracle, log, checked)


def _test(focus: str) -> Any:
    @SETTINGS
    @given(spec=catalogs(focus), history=st.lists(steps(), min_size=5, max_size=15),
           run_duration=st.sampled_from([0.0, 0.0, 2.0, 30.0]))
    def test(diff_db: Any, catalog_root: Path, spec: dict[str, Any],
             history: list[tuple[Any, ...]], run_duration: float) -> None:
        run_differential(diff_db, catalog_root, focus, spec, history, run_duration)

    test.__name__ = f"test_differential_{focus}"
    test.__doc__ = f"Core and oracle agree on every condition, catalogs focused on {focus}."
    return pytest.mark.integration(test)


test_differential_write = _test("write")
test_differential_changed = _test("changed")
test_differential_retraction = _test("retraction")
test_differential_accumulator = _test("accumulator")
test_differential_census = _test("census")
test_differential_lifecycle = _test("lifecycle")
test_differential_quiet = _test("quiet")
test_differential_at = _test("at")
