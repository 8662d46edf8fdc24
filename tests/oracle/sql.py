"""The reference evaluator: every trigger condition answered in SQL from PostgreSQL rows.

Written from seed 000 (the trigger spec) and ``docs/semantics.md`` only — it never
imports or mirrors the condition core (``wakeline.core``).  It reads the normalized
catalog (``wakeline.catalog``) to know what each trigger means, and the ``records`` /
``derivation_cursors`` tables for everything else.

    >>> install(conn)                                              # doctest: +SKIP
    >>> evaluate(conn, catalog, "profile.default", "default", "user:mia", now)  # doctest: +SKIP
    [{'kind': 'write', 'holds': True, 'value': 3, 'detail': {...}}, ...]

Per condition the answer is ``{kind, holds, value, detail}``, with ``value`` meaning
what :meth:`wakeline.testing.Simulator.evaluate` reports:

=========== ==============================================================
write       number of ready pending records in scope
changed     number of qualifying transitions (detail ``transitions``: the
            set of ``[seq, key, transition]``)
retraction  as changed, transitions ``removed`` only
accumulator the aggregate over the pending (windowed) rows; None when there
            are no rows or the aggregate is undefined
census      number of current records in scope (windowed)
lifecycle   the driving source's total ready history
quiet       number of ready pending records in scope (detail ``armed``: any
            pending; ``settles_at``: epoch seconds of the settle deadline)
at          earliest unhandled deadline, epoch seconds (None when none)
=========== ==============================================================

``cron`` and ``read`` are not evaluated (they are stimuli, not functions of rows).

Everything — scope matching, typed ``where`` predicates on jsonb (numbers, integers,
strings by code point, booleans, datetimes through a guarded cast, arrays), keyed
chains and heads (window functions / ``DISTINCT ON``), pending sets, aggregates and
windows — is computed by one SQL statement per catalog, evaluated for all requested
entities at once.  :func:`install` creates the few helper functions it uses
(``oracle_*``) in the target database.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import Connection, sql
from psycopg.types.json import Jsonb

from wakeline.catalog import (
    AccumulatorCondition,
    AtCondition,
    Catalog,
    CensusCondition,
    ChangedCondition,
    FieldRef,
    LifecycleCondition,
    QuietCondition,
    RetractionCondition,
    Scope,
    Source,
    WriteCondition,
)

__all__ = ["Oracle", "evaluate", "evaluate_all", "install"]

#: Kinds the oracle answers (cron and read are stimuli, not functions of rows).
KINDS = ("write", "changed", "retraction", "accumulator", "census", "lifecycle", "quiet", "at")

# -- helper functions in the database ---------------------------------------------------

#: An instant (docs/semantics.md: "ISO-8601 strings with a zone; a value that does not
#: parse fails"), read as the RFC 3339 profile of ISO 8601: extended calendar date,
#: ``T`` (or ``t`` / a space), hh:mm with optional seconds and up to microsecond
#: fractions, then ``Z`` or ±hh[[:]mm]; also the ISO basic form
#: ``YYYYMMDDThhmmss[.f](Z|±hh[mm])``.  The regexes guard the cast, so PostgreSQL's
#: liberal input syntax ('now', 'today', 'Jan 1 2026') never leaks in; the cast
#: rejects impossible dates (month 13, Feb 30) through the exception handler.
#: A string without a zone (naive, or a bare date) is not an instant — unless the
#: helpers' ``naive`` argument reads it as UTC (the oracle always passes false).
TS_EXTENDED = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]"
    r"(:[0-5][0-9](\.[0-9]{1,6})?)?([Zz]|[+-]([01][0-9]|2[0-3])(:?[0-5][0-9])?)$"
)
TS_BASIC = (
    r"^([0-9]{4})([0-9]{2})([0-9]{2})[Tt]([01][0-9]|2[0-3])([0-5][0-9])([0-5][0-9])"
    r"(\.[0-9]{1,6})?([Zz]|[+-]([01][0-9]|2[0-3])([0-5][0-9])?)$"
)
TS_NAIVE = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([Tt ]([01][0-9]|2[0-3]):[0-5][0-9]"
    r"(:[0-5][0-9](\.[0-9]{1,6})?)?)?$"
)

_FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION oracle_ts(s text, naive boolean) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    t text;
BEGIN
    IF s IS NULL THEN
        RETURN NULL;
    ELSIF s ~ '{TS_EXTENDED}' THEN
        t := upper(s);
    ELSIF s ~ '{TS_BASIC}' THEN
        t := upper(regexp_replace(s, '{TS_BASIC}', '\\1-\\2-\\3T\\4:\\5:\\6\\7\\8'));
    ELSIF naive AND s ~ '{TS_NAIVE}' THEN
        t := upper(s) || CASE WHEN length(s) = 10 THEN 'T00:00:00Z' ELSE 'Z' END;
    ELSE
        RETURN NULL;
    END IF;
    RETURN t::timestamptz;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$fn$;

-- A jsonb value as an instant: only JSON strings that parse.
CREATE OR REPLACE FUNCTION oracle_tsj(v jsonb, naive boolean) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
    IF v IS NULL OR jsonb_typeof(v) <> 'string' THEN
        RETURN NULL;
    END IF;
    RETURN oracle_ts(v #>> '{{}}', naive);
END
$fn$;

-- Is v a value of scalar type typ?  Booleans are not numbers; an integer is a
-- number without a fractional part.
CREATE OR REPLACE FUNCTION oracle_valid(v jsonb, typ text, naive boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
    IF v IS NULL THEN
        RETURN false;
    END IF;
    CASE typ
        WHEN 'number' THEN RETURN jsonb_typeof(v) = 'number';
        WHEN 'integer' THEN
            IF jsonb_typeof(v) <> 'number' THEN RETURN false; END IF;
            RETURN v::numeric = trunc(v::numeric);
        WHEN 'string' THEN RETURN jsonb_typeof(v) = 'string';
        WHEN 'boolean' THEN RETURN jsonb_typeof(v) = 'boolean';
        WHEN 'datetime' THEN RETURN oracle_tsj(v, naive) IS NOT NULL;
        ELSE RETURN false;
    END CASE;
END
$fn$;

-- Typed equality of two valid values of scalar type typ.
CREATE OR REPLACE FUNCTION oracle_eq(a jsonb, b jsonb, typ text, naive boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
    IF NOT oracle_valid(a, typ, naive) OR NOT oracle_valid(b, typ, naive) THEN
        RETURN false;
    END IF;
    CASE typ
        WHEN 'number', 'integer' THEN RETURN a::numeric = b::numeric;
        WHEN 'string' THEN RETURN (a #>> '{{}}') = (b #>> '{{}}');
        WHEN 'boolean' THEN RETURN a = b;
        WHEN 'datetime' THEN RETURN oracle_tsj(a, naive) = oracle_tsj(b, naive);
        ELSE RETURN false;
    END CASE;
END
$fn$;

-- Typed order: -1, 0, 1; NULL when either side is invalid or typ is unordered.
-- Strings compare by code point (COLLATE "C" on a UTF-8 database).
CREATE OR REPLACE FUNCTION oracle_cmp(a jsonb, b jsonb, typ text, naive boolean)
RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    x text;
    y text;
BEGIN
    IF NOT oracle_valid(a, typ, naive) OR NOT oracle_valid(b, typ, naive) THEN
        RETURN NULL;
    END IF;
    CASE typ
        WHEN 'number', 'integer' THEN
            RETURN sign(a::numeric - b::numeric)::integer;
        WHEN 'string' THEN
            x := a #>> '{{}}';
            y := b #>> '{{}}';
            IF x COLLATE "C" < y COLLATE "C" THEN RETURN -1; END IF;
            IF x COLLATE "C" > y COLLATE "C" THEN RETURN 1; END IF;
            RETURN 0;
        WHEN 'datetime' THEN
            RETURN CASE WHEN oracle_tsj(a, naive) < oracle_tsj(b, naive) THEN -1
                        WHEN oracle_tsj(a, naive) > oracle_tsj(b, naive) THEN 1 ELSE 0 END;
        ELSE RETURN NULL;
    END CASE;
END
$fn$;

-- One where predicate: `v op operand` for a field of type typ (items: the element
-- type of an array field).  v is NULL when the field is absent; JSON null counts as
-- absent.  A value of the wrong type fails every operator except exists.
CREATE OR REPLACE FUNCTION oracle_pred(v jsonb, op text, typ text, items text, operand jsonb,
                                       naive boolean)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    present boolean := v IS NOT NULL AND jsonb_typeof(v) <> 'null';
    c integer;
BEGIN
    IF op = 'exists' THEN
        RETURN present = (operand = 'true'::jsonb);
    END IF;
    IF NOT present THEN
        RETURN false;
    END IF;
    IF typ = 'array' THEN
        IF jsonb_typeof(v) <> 'array' THEN
            RETURN false;
        END IF;
        -- an array with an element of the wrong type is a value of the wrong type
        IF EXISTS (SELECT 1 FROM jsonb_array_elements(v) e
                   WHERE NOT oracle_valid(e, items, naive)) THEN
            RETURN false;
        END IF;
        IF op = 'eq' THEN
            RETURN jsonb_array_length(v) = jsonb_array_length(operand)
               AND NOT EXISTS (
                   SELECT 1 FROM generate_series(0, jsonb_array_length(v) - 1) AS i
                   WHERE NOT oracle_eq(v -> i, operand -> i, items, naive));
        ELSIF op = 'contains_any' THEN
            RETURN EXISTS (
                SELECT 1 FROM jsonb_array_elements(operand) o
                WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(v) e
                              WHERE oracle_eq(e, o, items, naive)));
        ELSIF op = 'contains_all' THEN
            RETURN NOT EXISTS (
                SELECT 1 FROM jsonb_array_elements(operand) o
                WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(v) e
                                  WHERE oracle_eq(e, o, items, naive)));
        END IF;
        RETURN false;
    END IF;
    IF NOT oracle_valid(v, typ, naive) THEN
        RETURN false;
    END IF;
    IF op = 'eq' THEN
        RETURN oracle_eq(v, operand, typ, naive);
    ELSIF op = 'in' THEN
        RETURN EXISTS (SELECT 1 FROM jsonb_array_elements(operand) o
                       WHERE oracle_eq(v, o, typ, naive));
    END IF;
    c := oracle_cmp(v, operand, typ, naive);
    IF c IS NULL THEN
        RETURN false;
    END IF;
    CASE op
        WHEN 'gt' THEN RETURN c > 0;
        WHEN 'gte' THEN RETURN c >= 0;
        WHEN 'lt' THEN RETURN c < 0;
        WHEN 'lte' THEN RETURN c <= 0;
        ELSE RETURN false;
    END CASE;
END
$fn$;
"""


def install(conn: Connection[Any]) -> None:
    """Create (or replace) the oracle's helper functions in the connected database."""
    conn.execute(_FUNCTIONS)


# -- SQL fragments ------------------------------------------------------------------------


#: Whether a datetime without a zone reads as UTC: never (docs/semantics.md).  The
#: helper functions keep the switch so the oracle can mimic a core that does.
_NAIVE = sql.SQL("false")


def _lit(value: Any) -> sql.Composable:
    # Rendered here so a '%' inside a catalog string cannot be read as a parameter.
    return sql.SQL(sql.Literal(value).as_string(None).replace("%", "%%"))


def _in(expr: sql.Composable, values: Iterable[Any]) -> sql.Composable:
    return sql.SQL("{} IN ({})").format(expr, sql.SQL(", ").join(_lit(v) for v in values))


def _col(alias: str, name: str) -> sql.Composable:
    return sql.Identifier(alias, name)


def _path(parts: Sequence[str]) -> sql.Composable:
    return sql.SQL("{}::text[]").format(_lit(list(parts)))


def field_expr(field: FieldRef, alias: str) -> sql.Composable:
    """The jsonb value of ``field`` in row ``alias`` (SQL NULL when absent/unbound)."""
    whens = []
    for b in field.bindings:
        if b.backing == "content":
            src = sql.SQL("{} #> {}").format(_col(alias, "content"), _path(b.path.split(".")))
        else:
            assert b.annotator is not None
            src = sql.SQL("{} #> {}").format(
                _col(alias, "annotations"), _path([b.annotator, *b.path.split(".")]))
        whens.append(sql.SQL("WHEN {c} = {cn} AND {v} = {vn} THEN {src}").format(
            c=_col(alias, "collection"), cn=_lit(b.collection),
            v=_col(alias, "collection_version"), vn=_lit(b.version), src=src))
    if not whens:
        return sql.SQL("NULL::jsonb")
    return sql.SQL("(CASE {} END)").format(sql.SQL(" ").join(whens))


def where_expr(scope: Scope, alias: str) -> sql.Composable:
    """Every where predicate of ``scope`` on row ``alias`` (TRUE when there is none)."""
    parts = []
    for p in scope.where:
        parts.append(sql.SQL("oracle_pred({v}, {op}, {t}, {items}, {operand}, {naive})").format(
            v=field_expr(p.field, alias), op=_lit(p.op), t=_lit(p.field.type),
            items=sql.SQL("{}::text").format(_lit(p.field.items)),
            operand=sql.SQL("{}::jsonb").format(_lit(Jsonb(p.value))), naive=_NAIVE))
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("TRUE")


def _base_expr(collections: Sequence[Any], types: Sequence[str] | None,
               statuses: Sequence[str] | None, alias: str) -> sql.Composable:
    pairs = sql.SQL(", ").join(
        sql.SQL("({}, {})").format(_lit(c.collection), _lit(c.version)) for c in collections)
    parts = [sql.SQL("({}, {}) IN ({})").format(
        _col(alias, "collection"), _col(alias, "collection_version"), pairs)]
    if types is not None:
        parts.append(_in(_col(alias, "type"), types))
    if statuses is not None:
        parts.append(_in(_col(alias, "status"), statuses))
    return sql.SQL("({})").format(sql.SQL(" AND ").join(parts))


def scope_expr(scope: Scope, alias: str, *, where: bool = True) -> sql.Composable:
    """Is row ``alias`` in ``scope`` (collections+version, types, statuses, where)?"""
    base = _base_expr(scope.collections, scope.types, scope.statuses, alias)
    if not where or not scope.where:
        return base
    return sql.SQL("({} AND {})").format(base, where_expr(scope, alias))


def source_expr(source: Source, alias: str) -> sql.Composable:
    """Is row ``alias`` a record of the driving source?"""
    return _base_expr(source.collections, source.types, source.statuses, alias)


def _window_expr(window: Any, alias: str) -> sql.Composable:
    """Event time in the current hopping window: s <= created_at <= now with
    s = (floor((now - size_s) / hop_s) + 1) * hop_s."""
    if window is None:
        return sql.SQL("TRUE")
    return sql.SQL(
        "({ca} >= to_timestamp((floor((extract(epoch FROM %(now)s::timestamptz) - {size})"
        " / {hop}) + 1) * {hop}) AND {ca} <= %(now)s::timestamptz)"
    ).format(ca=_col(alias, "created_at"), size=_lit(window.size_s), hop=_lit(window.hop_s))


# -- per-condition queries -------------------------------------------------------------------
#
# Shared CTEs (built in Oracle._query):
#   ents(entity)         the requested entities
#   ready                ready rows of those entities in the workspace
#   heads                latest ready active row per keyed slot (tombstones included)
#   cur                  heads that are not tombstones, plus every ready event row
#   chain                ready active keyed rows with their predecessor's seq (lag)
#   cur_<i>              per derivation i: watermark (0 without a row), last success,
#                        at_handled_through, one row per entity
#
# Each condition is a SELECT of (tag, entity, holds, value jsonb, detail jsonb).


def _pending_join(source: Source, alias: str = "r") -> sql.Composable:
    """Row ``alias`` is a pending record of the driving source (of entity e)."""
    return sql.SQL("{a}.entity = e.entity AND {a}.seq > e.w AND {src}").format(
        a=sql.Identifier(alias), src=source_expr(source, alias))


def _q_write(tag: str, d: int, source: Source, cond: WriteCondition) -> sql.Composable:
    return sql.SQL(
        "SELECT {tag}::text AS tag, e.entity, count(r.seq) > 0 AS holds,"
        " to_jsonb(count(r.seq)) AS value,"
        " jsonb_build_object('seqs', COALESCE(jsonb_agg(r.seq ORDER BY r.seq)"
        "   FILTER (WHERE r.seq IS NOT NULL), '[]'::jsonb)) AS detail"
        " FROM {cur} e LEFT JOIN ready r ON {pending} AND {scope}"
        " GROUP BY e.entity"
    ).format(tag=_lit(tag), cur=sql.Identifier(f"cur_{d}"),
             pending=_pending_join(source), scope=scope_expr(cond.scope, "r"))


def _q_quiet(tag: str, d: int, source: Source, cond: QuietCondition) -> sql.Composable:
    # settles_at = min(last arrival + after_s, first arrival + max_wait_s); the
    # condition holds (docs/semantics.md) once now >= settles_at.  detail.armed says
    # whether any matching record is pending at all.
    settle = sql.SQL("max(r.enriched_at) + make_interval(secs => {})").format(_lit(cond.after_s))
    if cond.max_wait_s is not None:
        settle = sql.SQL("LEAST({}, min(r.enriched_at) + make_interval(secs => {}))").format(
            settle, _lit(cond.max_wait_s))
    return sql.SQL(
        "SELECT {tag}::text, e.entity,"
        " count(r.seq) > 0 AND %(now)s::timestamptz >= {settle},"
        " to_jsonb(count(r.seq)),"
        " jsonb_build_object('armed', count(r.seq) > 0,"
        "   'settles_at', extract(epoch FROM {settle})::float8,"
        "   'last_arrival', max(r.enriched_at), 'first_arrival', min(r.enriched_at))"
        " FROM {cur} e LEFT JOIN ready r ON {pending} AND {scope}"
        " GROUP BY e.entity"
    ).format(tag=_lit(tag), settle=settle, cur=sql.Identifier(f"cur_{d}"),
             pending=_pending_join(source), scope=scope_expr(cond.scope, "r"))


def _q_changed(tag: str, d: int, source: Source, scope: Scope, keys: Sequence[str] | None,
               transitions: Sequence[str]) -> sql.Composable:
    # r: the chain row; p: its predecessor in the slot chain (ready, active, by seq).
    # For a removed transition (r a tombstone) where is evaluated on the retracted head.
    keys_ok = _in(sql.SQL("c.key"), keys) if keys is not None else sql.SQL("TRUE")
    return sql.SQL(
        "SELECT {tag}::text, e.entity, count(x.seq) > 0, to_jsonb(count(x.seq)),"
        " jsonb_build_object('transitions', COALESCE(jsonb_agg(jsonb_build_array(x.seq, x.key,"
        "   x.tr) ORDER BY x.seq) FILTER (WHERE x.seq IS NOT NULL), '[]'::jsonb))"
        " FROM {cur} e LEFT JOIN ("
        "   SELECT c.entity, c.seq, c.key,"
        "     CASE WHEN NOT c.tombstone AND (p.seq IS NULL OR p.tombstone) THEN 'added'"
        "          WHEN NOT c.tombstone AND (c.content::text <> p.content::text"
        "                                    OR c.text <> p.text) THEN 'changed'"
        "          WHEN c.tombstone AND p.seq IS NOT NULL AND NOT p.tombstone THEN 'removed'"
        "     END AS tr,"
        "     CASE WHEN c.tombstone THEN {where_p} ELSE {where_c} END AS where_ok"
        "   FROM chain c LEFT JOIN records p ON p.seq = c.prev_seq"
        "   WHERE {src} AND {base} AND {keys_ok}"
        " ) x ON x.entity = e.entity AND x.seq > e.w AND x.where_ok AND {tr_ok}"
        " GROUP BY e.entity"
    ).format(
        tag=_lit(tag), cur=sql.Identifier(f"cur_{d}"),
        where_p=where_expr(scope, "p"),
        where_c=where_expr(scope, "c"),
        src=source_expr(source, "c"), base=scope_expr(scope, "c", where=False),
        keys_ok=keys_ok, tr_ok=_in(sql.SQL("x.tr"), transitions))


def _aggregate(cond: AccumulatorCondition) -> sql.Composable:
    m = cond.metric
    if m.kind == "count":
        return sql.SQL("count(r.seq)::float8")
    if m.kind == "scorer":
        mv = sql.SQL("(r.scores -> {})").format(_lit(m.scorer))
    else:
        assert m.annotator is not None and m.path is not None
        mv = sql.SQL("(r.annotations #> {})").format(_path([m.annotator, *m.path.split(".")]))
    # present: a JSON number (never a boolean); count and distinct_count over
    # annotation leaves count any JSON scalar (docs/semantics.md, Accumulator values).
    number = sql.SQL("CASE WHEN jsonb_typeof({mv}) = 'number' THEN ({mv})::float8 END").format(
        mv=mv)
    agg = m.aggregate
    # count and distinct_count of an annotation leaf: any JSON scalar is present.
    kinds = ("number", "string", "boolean") if m.kind == "annotation" else ("number",)
    scalar = sql.SQL("CASE WHEN jsonb_typeof({mv}) IN ({k}) THEN {mv} END").format(
        mv=mv, k=sql.SQL(", ").join(_lit(k) for k in kinds))
    if agg == "sum":
        return sql.SQL("COALESCE(sum({}), 0)::float8").format(number)
    if agg == "count":
        return sql.SQL("count({})::float8").format(scalar)
    if agg in ("avg", "max", "min"):
        return sql.SQL("{}({})::float8").format(sql.SQL(agg), number)
    assert agg == "distinct_count"
    # jsonb equality: 1 and 1.0 are one value, true and 1 are two
    return sql.SQL("count(DISTINCT {})::float8").format(scalar)


def _q_accumulator(tag: str, d: int, source: Source, cond: AccumulatorCondition
                   ) -> sql.Composable:
    cmp = sql.SQL(">=") if cond.comparison == "gte" else sql.SQL("<=")
    return sql.SQL(
        "SELECT {tag}::text, e.entity,"
        " q.n > 0 AND q.a IS NOT NULL AND q.a {cmp} {thr}::float8,"
        " CASE WHEN q.n > 0 THEN to_jsonb(q.a) ELSE 'null'::jsonb END,"
        " jsonb_build_object('records', q.n)"
        " FROM {cur} e JOIN ("
        "   SELECT e.entity, count(r.seq) AS n, {agg} AS a"
        "   FROM {cur} e LEFT JOIN ready r ON {pending} AND {scope} AND {window}"
        "   GROUP BY e.entity) q ON q.entity = e.entity"
    ).format(tag=_lit(tag), cmp=cmp, thr=_lit(cond.threshold), cur=sql.Identifier(f"cur_{d}"),
             agg=_aggregate(cond), pending=_pending_join(source),
             scope=scope_expr(cond.scope, "r"), window=_window_expr(cond.window, "r"))


def _fresh(source: Source) -> sql.Composable:
    return sql.SQL("EXISTS (SELECT 1 FROM ready r WHERE {})").format(_pending_join(source))


def _q_census(tag: str, d: int, source: Source, cond: CensusCondition) -> sql.Composable:
    return sql.SQL(
        "SELECT {tag}::text, q.entity, q.n >= {thr} AND q.fresh, to_jsonb(q.n),"
        " jsonb_build_object('fresh', q.fresh)"
        " FROM (SELECT e.entity,"
        "   (SELECT count(*) FROM cur r WHERE r.entity = e.entity AND {scope} AND {window}) AS n,"
        "   {fresh} AS fresh"
        "   FROM {cur} e) q"
    ).format(tag=_lit(tag), thr=_lit(cond.threshold), scope=scope_expr(cond.scope, "r"),
             window=_window_expr(cond.window, "r"), fresh=_fresh(source),
             cur=sql.Identifier(f"cur_{d}"))


def _q_lifecycle(tag: str, d: int, source: Source, cond: LifecycleCondition) -> sql.Composable:
    first = sql.SQL("q.last_success_at IS NULL") if cond.first_record else sql.SQL("FALSE")
    total = (sql.SQL("q.n >= {}").format(_lit(cond.total_records))
             if cond.total_records is not None else sql.SQL("FALSE"))
    return sql.SQL(
        "SELECT {tag}::text, q.entity, q.fresh AND ({first} OR {total}), to_jsonb(q.n),"
        " jsonb_build_object('fresh', q.fresh, 'never_succeeded', q.last_success_at IS NULL)"
        " FROM (SELECT e.entity, e.last_success_at,"
        "   (SELECT count(*) FROM ready r WHERE r.entity = e.entity AND {src}) AS n,"
        "   {fresh} AS fresh"
        "   FROM {cur} e) q"
    ).format(tag=_lit(tag), first=first, total=total, src=source_expr(source, "r"),
             fresh=_fresh(source), cur=sql.Identifier(f"cur_{d}"))


def _q_at(tag: str, d: int, cond: AtCondition) -> sql.Composable:
    deadline = sql.SQL("(oracle_tsj({}, false) + make_interval(secs => {}))").format(
        field_expr(cond.field, "r"), _lit(cond.offset_s))

    def earliest(current: sql.Composable) -> sql.Composable:
        return sql.SQL(
            "SELECT r.entity, r.seq, {deadline} AS d FROM {current} r WHERE {scope}"
        ).format(deadline=deadline, current=current, scope=scope_expr(cond.scope, "r"))

    unhandled = sql.SQL(
        "x.entity = e.entity AND x.d IS NOT NULL"
        " AND (e.at_handled_through IS NULL OR x.d > e.at_handled_through)")
    return sql.SQL(
        "SELECT {tag}::text, e.entity, min(x.d) IS NOT NULL,"
        " to_jsonb(extract(epoch FROM min(x.d))::float8),"
        " jsonb_build_object('seq', (array_agg(x.seq ORDER BY x.d, x.seq))[1])"
        " FROM {cur} e LEFT JOIN ({q}) x ON {u}"
        " GROUP BY e.entity, e.at_handled_through"
    ).format(tag=_lit(tag), cur=sql.Identifier(f"cur_{d}"), q=earliest(sql.SQL("cur")),
             u=unhandled)


# -- the evaluator ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    trigger: str
    index: int
    kind: str


class Oracle:
    """One compiled SQL statement answering every condition of ``catalog``.

    Build once per catalog; :meth:`run` executes it (server-side prepared) for a set
    of entities at ``now``.
    """

    def __init__(self, catalog: Catalog, workspace: str = "default",
                 triggers: Iterable[str] | None = None) -> None:
        self.catalog = catalog
        self.workspace = workspace
        names = sorted(catalog.triggers) if triggers is None else list(triggers)
        self.derivations = sorted({catalog.triggers[t].derivation for t in names})
        self.slots: dict[str, _Slot] = {}
        parts: list[sql.Composable] = []
        for t in names:
            trig = catalog.triggers[t]
            d = self.derivations.index(trig.derivation)
            source = catalog.derivations[trig.derivation].source
            for i, cond in enumerate(trig.conditions):
                if cond.kind not in KINDS:
                    continue
                tag = f"{t}#{i}"
                self.slots[tag] = _Slot(t, i, cond.kind)
                parts.append(self._condition(tag, d, source, cond))
        self.triggers = names
        self.query = self._query(parts).as_string(None) if parts else None

    @staticmethod
    def _condition(tag: str, d: int, source: Source, cond: Any) -> sql.Composable:
        if isinstance(cond, WriteCondition):
            return _q_write(tag, d, source, cond)
        if isinstance(cond, QuietCondition):
            return _q_quiet(tag, d, source, cond)
        if isinstance(cond, ChangedCondition):
            return _q_changed(tag, d, source, cond.scope, cond.keys, cond.transitions)
        if isinstance(cond, RetractionCondition):
            return _q_changed(tag, d, source, cond.scope, None, ("removed",))
        if isinstance(cond, AccumulatorCondition):
            return _q_accumulator(tag, d, source, cond)
        if isinstance(cond, CensusCondition):
            return _q_census(tag, d, source, cond)
        if isinstance(cond, LifecycleCondition):
            return _q_lifecycle(tag, d, source, cond)
        if isinstance(cond, AtCondition):
            return _q_at(tag, d, cond)
        raise TypeError(f"no oracle for {cond.kind}")

    def _query(self, parts: list[sql.Composable]) -> sql.Composable:
        curs = [
            sql.SQL(
                "{name} AS (SELECT x.entity, COALESCE(c.watermark, 0) AS w, c.last_success_at,"
                " c.at_handled_through FROM ents x LEFT JOIN derivation_cursors c"
                " ON c.workspace = %(ws)s AND c.derivation = {d} AND c.entity = x.entity)"
            ).format(name=sql.Identifier(f"cur_{i}"), d=_lit(name))
            for i, name in enumerate(self.derivations)
        ]
        return sql.SQL(
            "WITH ents(entity) AS (SELECT DISTINCT unnest(%(ents)s::text[])),"
            " ready AS MATERIALIZED (SELECT r.* FROM records r"
            "   WHERE r.workspace = %(ws)s AND r.entity = ANY(%(ents)s::text[])"
            "   AND r.enriched_at IS NOT NULL),"
            " heads AS (SELECT DISTINCT ON (r.entity, r.collection, r.key) r.* FROM ready r"
            "   WHERE r.key IS NOT NULL AND r.status = 'active'"
            "   ORDER BY r.entity, r.collection, r.key, r.seq DESC),"
            " cur AS (SELECT * FROM heads WHERE NOT tombstone"
            "   UNION ALL SELECT * FROM ready WHERE key IS NULL),"
            " chain AS (SELECT r.*, lag(r.seq) OVER (PARTITION BY r.entity, r.collection, r.key"
            "   ORDER BY r.seq) AS prev_seq FROM ready r"
            "   WHERE r.key IS NOT NULL AND r.status = 'active'),"
            " {curs}"
            " {body}"
        ).format(curs=sql.SQL(", ").join(curs),
                 body=sql.SQL(" UNION ALL ").join(sql.SQL("({})").format(p) for p in parts))

    def run(self, conn: Connection[Any], now: datetime, entities: Iterable[str] | None = None
            ) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """``{(trigger, entity): [{kind, holds, value, detail}, ...]}`` in condition order.

        ``entities`` defaults to every entity with a record or a cursor row.
        """
        if entities is None:
            rows = conn.execute(
                "SELECT entity FROM records WHERE workspace = %s UNION"
                " SELECT entity FROM derivation_cursors WHERE workspace = %s",
                (self.workspace, self.workspace)).fetchall()
            entities = [r[0] for r in rows]
        ents = sorted(set(entities))
        out: dict[tuple[str, str], list[dict[str, Any]]] = {
            (t, e): [] for t in self.triggers for e in ents}
        if self.query is None or not ents:
            return out
        found: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
        params = {"ws": self.workspace, "ents": ents, "now": now}
        cur = conn.execute(self.query, params, prepare=True)
        for tag, entity, holds, value, detail in cur.fetchall():
            slot = self.slots[tag]
            found.setdefault((slot.trigger, entity), {})[slot.index] = {
                "kind": slot.kind, "holds": bool(holds), "value": _value(slot.kind, value),
                "detail": detail,
            }
        for key, by_index in found.items():
            out[key] = [by_index[i] for i in sorted(by_index)]
        return out


def _value(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind in ("accumulator", "at"):
        return float(value)
    return int(value)


def evaluate_all(conn: Connection[Any], catalog: Catalog, now: datetime, *,
                 workspace: str = "default", entities: Iterable[str] | None = None,
                 triggers: Iterable[str] | None = None
                 ) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every condition of every (or the given) trigger for every (or the given) entity."""
    return Oracle(catalog, workspace, triggers).run(conn, now, entities)


def evaluate(conn: Connection[Any], catalog: Catalog, trigger: str, workspace: str,
             entity: str, now: datetime) -> list[dict[str, Any]]:
    """The oracle's answer per condition of ``trigger`` for one entity (cron/read skipped)."""
    result = Oracle(catalog, workspace, [trigger]).run(conn, now, [entity])
    return result[(trigger, entity)]
