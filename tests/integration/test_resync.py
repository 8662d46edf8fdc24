"""A resync reads its entities' cursor rows from PostgreSQL in one query per batch, and
turns each row whose job is the entity's running one, and has ended, into the run's end."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest

from wakeline.core.events import CursorAdvanced
from wakeline.core.state import EntityState, Job
from wakeline.store import migrate
from wakeline.streams.batch import cursor_rows, finished_runs

pytestmark = pytest.mark.integration

AT = datetime(2026, 7, 19, 9, 0, tzinfo=UTC)


def _cursors(dsn: str, rows: list[tuple[str, str, str, int, str | None, str | None]]) -> None:
    with psycopg.connect(dsn) as conn:
        for workspace, derivation, entity, watermark, outcome, job_id in rows:
            conn.execute(
                "INSERT INTO derivation_cursors (workspace, derivation, entity, watermark, "
                "last_run_at, last_outcome, last_job_id) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (workspace, derivation, entity, watermark, AT if outcome else None, outcome,
                 job_id))


def test_cursor_rows_of_many_entities_in_one_read(pg_dsn: str) -> None:
    migrate(pg_dsn)
    _cursors(pg_dsn, [
        ("w1", "d", "a", 7, "succeeded", "j-a"),
        ("w1", "e", "a", 3, "failed", "j-a2"),
        ("w2", "d", "a", 9, "succeeded", "j-other-workspace"),
        ("w1", "d", "b", 2, None, None),
        ("w1", "d", "c", 5, "succeeded", "j-c"),  # not asked for
    ])
    got = cursor_rows(pg_dsn, [("w1", "a"), ("w1", "b"), ("w1", "missing")])
    assert {k: sorted(v) for k, v in got.items()} == {
        ("w1", "a"): [("d", 7, AT, "succeeded", "j-a"), ("e", 3, AT, "failed", "j-a2")],
        ("w1", "b"): [("d", 2, None, None, None)],
    }
    assert cursor_rows(pg_dsn, []) == {}


def test_only_the_running_jobs_that_ended_come_back_as_their_ends() -> None:
    st = EntityState("w1", "a")
    st.d("d").running = Job("j-a", {}, 0.0)
    st.d("e").running = Job("j-new", {}, 0.0)  # its row is an earlier job's end
    st.d("f").running = Job("j-f", {}, 0.0)  # its row has no end yet
    rows = [("d", 7, AT, "succeeded", "j-a"), ("e", 3, AT, "failed", "j-a2"),
            ("f", 1, None, None, "j-f"), ("g", 4, AT, "succeeded", "j-g")]  # g: not running
    assert finished_runs(st, rows) == [
        CursorAdvanced("d", 7, AT.timestamp(), "succeeded", "j-a")]
    assert finished_runs(EntityState("w1", "b"), [("d", 2, None, None, None)]) == []
