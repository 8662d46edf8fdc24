"""The outcome writer against real PostgreSQL: its own COPY text, overflow and refused
rows counted and recorded, never lost silently."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from wakeline.core.outcomes import Outcome, OutcomeKind
from wakeline.store import migrate
from wakeline.streams.sinks import OutcomeWriter

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 5, 9, 30, 0, 123456, tzinfo=UTC)


def _rows(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT workspace, derivation, trigger, entity, kind, reason, detail, at "
            "FROM outcomes ORDER BY id").fetchall()


def _write(dsn: str, chunks: list[list[Outcome]], **kw) -> OutcomeWriter:
    w = OutcomeWriter(dsn, interval=0.01, **kw)
    for c in chunks:
        w.put(c)
    w.close()
    return w


def test_fields_survive_copy_text_exactly(pg_dsn: str) -> None:
    migrate(pg_dsn)
    nasty = "tab\there\nnew line\\back\\slash\r ünï 🚀 \\N"
    outs = [
        Outcome(OutcomeKind.BELOW_THRESHOLD, nasty, T0, "ws\t1", "user:\\mia", "d\n1", "t 1",
                {"value": 3.5, "threshold": 10, "who": nasty, "q": 'say "hi"', 7: "int key"}),
        Outcome(OutcomeKind.NO_PENDING, "plain", T0 + timedelta(seconds=1), "ws", "e", None,
                None, {}),
        Outcome(OutcomeKind.CENSUS_BELOW, "big", T0, "ws", "e", "d", "t", {"n": 2**70}),
    ]
    w = _write(pg_dsn, [outs[:2], outs[2:]])
    assert (w.written, w.dropped) == (3, 0)
    got = _rows(pg_dsn)
    assert got == [
        ("ws\t1", "d\n1", "t 1", "user:\\mia", "below_threshold", nasty,
         {"value": 3.5, "threshold": 10, "who": nasty, "q": 'say "hi"', "7": "int key"}, T0),
        ("ws", None, None, "e", "no_pending", "plain", {}, T0 + timedelta(seconds=1)),
        ("ws", "d", "t", "e", "census_below", "big", {"n": 2**70}, T0),
    ]


def test_overflow_is_counted_and_recorded(pg_dsn: str) -> None:
    migrate(pg_dsn)
    outs = [Outcome(OutcomeKind.DEBOUNCE, f"r{i}", T0 + timedelta(seconds=i), "ws", "e", "d",
                    "t", {"i": i}) for i in range(5)]
    w = _write(pg_dsn, [outs], maxsize=3)
    assert w.dropped == 2
    got = _rows(pg_dsn)
    assert [r[5] for r in got[:3]] == ["r0", "r1", "r2"]
    assert got[3][4] == "outcomes_dropped" and got[3][6] == {"count": 2}
    assert got[3][7] == T0 + timedelta(seconds=4)  # the newest lost outcome's instant
    assert w.written == 4


def test_a_refused_row_costs_only_itself(pg_dsn: str) -> None:
    migrate(pg_dsn)
    ok = [Outcome(OutcomeKind.COOLDOWN, f"ok{i}", T0, "ws", "e", "d", "t") for i in range(3)]
    bad = Outcome(OutcomeKind.COOLDOWN, "NUL \x00 is not text to PostgreSQL", T0, "ws", "e")
    w = _write(pg_dsn, [ok[:2] + [bad] + ok[2:]])
    got = _rows(pg_dsn)
    assert [r[5] for r in got[:3]] == ["ok0", "ok1", "ok2"]
    assert got[3][4] == "outcomes_dropped" and got[3][6] == {"count": 1}
    assert (w.written, w.dropped) == (4, 1)
