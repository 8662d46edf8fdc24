"""Schema migrations and the store's record writes against real PostgreSQL."""

from __future__ import annotations

import psycopg
import pytest

from wakeline.clock import ManualClock
from wakeline.store import NoLiveHead, Store, current_version, migrate
from wakeline.store.migrate import available
from wakeline.store.records import InvalidRecord

pytestmark = pytest.mark.integration


@pytest.fixture
def store(pg_dsn: str):
    migrate(pg_dsn)
    clock = ManualClock("2026-07-19T09:00:00Z")
    s = Store.connect(pg_dsn, clock)
    yield s
    s.close()


def test_migrations_apply_twice_cleanly(pg_dsn: str) -> None:
    first = migrate(pg_dsn)
    assert [m.version for m in first] == [m.version for m in available()]
    assert migrate(pg_dsn) == []
    assert current_version(pg_dsn) == available()[-1].version
    with psycopg.connect(pg_dsn) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}
    assert {"records", "derivation_cursors", "jobs", "runs", "outcomes", "feed_cursors",
            "cron_buckets"} <= tables


def test_edited_migration_is_rejected(pg_dsn: str) -> None:
    migrate(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE wakeline_migrations SET checksum = 'x' WHERE version = 1")
    with pytest.raises(Exception, match="edited after it was applied"):
        migrate(pg_dsn)


def test_insert_and_mark_ready_in_one_update(store: Store) -> None:
    a = store.insert_record(workspace="default", entity="user:mia", collection="main",
                            type="chat", content={"text": "hi"}, text="hi")
    b = store.insert_record(workspace="default", entity="user:mia", collection="main",
                            type="chat", content={"text": "there"}, text="there")
    assert store.get_record(a).enriched_at is None
    store.clock.advance(5)  # type: ignore[attr-defined]
    made = store.mark_ready([a, b], annotations={a: {"sentiment_v1": {"valence": 0.5}}},
                            scores={a: {"importance": 7}, b: {"importance": 2}})
    assert made == [a, b]
    ra = store.get_record(a)
    assert ra.ready and ra.scores == {"importance": 7}
    assert ra.annotations == {"sentiment_v1": {"valence": 0.5}}
    assert ra.enriched_at == store.clock.now()
    # idempotent: already-ready rows are left alone
    assert store.mark_ready([a], scores={a: {"importance": 99}}) == []
    assert store.get_record(a).scores == {"importance": 7}


def test_keyed_heads_and_retraction(store: Store) -> None:
    kw = dict(workspace="default", entity="user:mia", collection="profiles", ready=True)
    s1 = store.insert_record(key="role", content={"value": "engineer"}, **kw)
    s2 = store.insert_record(key="role", content={"value": "manager"}, **kw)
    store.insert_record(key="city", content={"value": "Oslo"}, **kw)
    unready = store.insert_record(workspace="default", entity="user:mia",
                                  collection="profiles", key="city", content={"value": "Rome"})
    heads = {h.key: h for h in store.keyed_heads("default", "user:mia", "profiles")}
    assert heads["role"].seq == s2 and heads["role"].content == {"value": "manager"}
    assert heads["city"].content == {"value": "Oslo"}, "an unready row is never the head"
    assert unready > s2

    t = store.retract("default", "user:mia", "profiles", "role")
    tomb = store.get_record(t)
    assert tomb.tombstone and tomb.parents == [s2] and tomb.text == "" and tomb.ready
    assert tomb.content == {"tombstone": True}
    assert {h.key for h in store.keyed_heads("default", "user:mia")} == {"city"}
    with_tombs = store.keyed_heads("default", "user:mia", include_tombstones=True)
    assert {h.key: h.tombstone for h in with_tombs} == {"city": False, "role": True}
    with pytest.raises(NoLiveHead):
        store.retract("default", "user:mia", "profiles", "role")
    with pytest.raises(NoLiveHead):
        store.retract("default", "user:mia", "profiles", "never-set")
    assert s1 < s2


def test_tombstone_shape_is_enforced(store: Store) -> None:
    with pytest.raises(InvalidRecord, match="retract"):
        store.insert_record(workspace="default", entity="e", collection="profiles", key="k",
                            content={"tombstone": True})
    with store.conn.transaction(), pytest.raises(psycopg.errors.CheckViolation):
        with store.conn.transaction():
            store.conn.execute(
                "INSERT INTO records (workspace, entity, collection, key, tombstone, enriched_at)"
                " VALUES ('default', 'e', 'profiles', 'k', true, now())")


def test_one_queued_job_per_mailbox(store: Store) -> None:
    ins = ("INSERT INTO jobs (job_id, workspace, derivation, entity, state) "
           "VALUES (%s, 'default', 'profile', 'user:mia', %s)")
    store.conn.execute(ins, ("j1", "queued"))
    store.conn.execute(ins, ("j2", "running"))
    with pytest.raises(psycopg.errors.UniqueViolation):
        store.conn.execute(ins, ("j3", "queued"))
    with pytest.raises(psycopg.errors.UniqueViolation):
        store.conn.execute(ins, ("j4", "running"))


def test_cli_db_migrate_applies_then_reports_up_to_date(pg_dsn: str) -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "wakeline.cli.main", "db", "migrate", "--dsn", pg_dsn]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert "applied 0001_init" in first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "(up to date)" in second.stdout
    bad = subprocess.run([sys.executable, "-m", "wakeline.cli.main", "db", "migrate"],
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "WAKELINE_HOME": "/nonexistent"})
    assert bad.returncode == 2 and "no database" in bad.stderr
