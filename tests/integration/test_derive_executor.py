"""The derive executor against real PostgreSQL: one transaction, guarded, classified."""

from __future__ import annotations

import psycopg
import pytest

from wakeline.catalog import compile_catalog
from wakeline.derive import DeriveExecutor, JobSpec, PermanentError, TransientError
from wakeline.store import Store, migrate
from tests.unit.core.helpers import catalog_dir, derivation

pytestmark = pytest.mark.integration

EXTRA = '''
import time

def slow(ctx):
    time.sleep(3)
    return []

def keyed(ctx):
    out = []
    for r in ctx.records:
        c = r["content"]
        if "set" in c:
            out.append({"collection": "outk", "key": c["set"], "content": {"n": c["n"]}, "text": ""})
        if "unset" in c:
            out.append({"collection": "outk", "key": c["unset"], "retract": True})
    return out

def bad(ctx):
    return [{"collection": "nowhere", "type": "x", "content": {}}]
'''


@pytest.fixture
def env(tmp_path, pg_dsn):
    root = catalog_dir(tmp_path, {
        "count": derivation("count", "write: {}", function="simfuncs:count", emits="[out]"),
        "keyed": derivation("keyed", None, function="extra:keyed", emits="[outk]"),
        "slow": derivation("slow", None, function="extra:slow", extra="timeout_s: 1\n"),
        "bad": derivation("bad", None, function="extra:bad", emits="[out]"),
    })
    (root / "extra.py").write_text(EXTRA)
    catalog = compile_catalog(root)
    migrate(pg_dsn)
    store = Store.connect(pg_dsn)
    ex = DeriveExecutor(catalog, pg_dsn, max_attempts=3)
    yield ex, store, pg_dsn
    ex.close()
    store.close()


def chat(store, **kw):
    kw.setdefault("ready", True)
    return store.insert_record(workspace="default", entity="user:mia", collection="main",
                               type="chat", **kw)


def job(derivation, n=1, attempt=1, reasons=("manual",)):
    return JobSpec(f"default/{derivation}/user:mia/{n}", "default", derivation, "user:mia",
                   tuple(reasons), attempt=attempt)


def q(dsn, sql, *args):
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, args).fetchall()


def test_success_co_commits_outputs_cursor_run_and_job(env):
    ex, store, dsn = env
    a, b = chat(store), chat(store)
    res = ex.execute(job("count", reasons=("trigger:count.default:write", "manual")))
    assert res.outcome == "succeeded" and res.watermark_after == b and res.records_consumed == 2
    [(wm, outcome, last_job)] = q(dsn, "SELECT watermark, last_outcome, last_job_id FROM "
                                       "derivation_cursors WHERE derivation = 'count'")
    assert (wm, outcome, last_job) == (b, "succeeded", res.job_id)
    [(reasons, hashes, run_outcome)] = q(dsn, "SELECT trigger_reasons, definition_hashes, outcome "
                                              "FROM runs")
    assert reasons == ["manual", "trigger:count.default:write"] and run_outcome == "succeeded"
    assert set(hashes) == {"catalog", "derivation:count", "trigger:count.default"}
    [(content, produced_by)] = q(dsn, "SELECT content, produced_by_run FROM records "
                                      "WHERE collection = 'out'")
    assert content == {"n": 2} and produced_by == res.run_id
    assert q(dsn, "SELECT state FROM jobs") == [("succeeded",)]
    assert a < b


def test_redelivered_job_never_applies_twice(env):
    ex, store, dsn = env
    chat(store)
    assert ex.execute(job("count")).outcome == "succeeded"
    chat(store)
    again = ex.execute(job("count"))
    assert again.outcome == "duplicate"
    assert q(dsn, "SELECT count(*) FROM runs") == [(1,)]
    assert q(dsn, "SELECT count(*) FROM records WHERE collection = 'out'") == [(1,)]


def test_noop_when_nothing_is_pending(env):
    ex, store, dsn = env
    res = ex.execute(job("count"))
    assert res.outcome == "noop" and res.records_consumed == 0
    assert q(dsn, "SELECT outcome FROM runs") == [("noop",)]
    assert q(dsn, "SELECT count(*) FROM records") == [(0,)]
    assert q(dsn, "SELECT last_success_at IS NOT NULL FROM derivation_cursors") == [(True,)]


def test_watermark_never_passes_an_unready_record(env):
    ex, store, dsn = env
    a = chat(store)
    u = chat(store, ready=False)
    chat(store)
    res = ex.execute(job("count"))
    assert res.watermark_after == a and res.records_consumed == 1
    store.mark_ready([u])
    res2 = ex.execute(job("count", 2))
    assert res2.watermark_after == u + 1 and res2.records_consumed == 2


def test_keyed_upsert_and_retraction_tombstone(env):
    ex, store, dsn = env
    chat(store, content={"set": "x", "n": 1})
    ex.execute(job("keyed"))
    chat(store, content={"unset": "x"})
    chat(store, content={"unset": "never"})      # retracting an absent key is a no-op
    res = ex.execute(job("keyed", 2))
    assert res.outcome == "succeeded" and len(res.emitted) == 1
    rows = q(dsn, "SELECT seq, key, tombstone, parents FROM records WHERE collection = 'outk' "
                  "ORDER BY seq")
    assert rows[1][2] is True and rows[1][3] == [rows[0][0]]


def test_transient_failures_retry_with_backoff_then_dead(env):
    ex, store, dsn = env
    chat(store)
    ex.fail = lambda j: TransientError("model overloaded")
    r1 = ex.execute(job("count", attempt=1))
    r2 = ex.execute(job("count", attempt=2))
    r3 = ex.execute(job("count", attempt=3))
    assert [r.outcome for r in (r1, r2, r3)] == ["failed", "failed", "dead"]
    assert (r1.retry_in, r2.retry_in, r3.retry_in) == (2.0, 4.0, None)
    assert q(dsn, "SELECT state, attempts, error_kind FROM jobs") == [("dead", 3, "transient")]
    assert q(dsn, "SELECT watermark, last_outcome FROM derivation_cursors") == [(0, "dead")]


def test_permanent_and_config_failures_are_not_retried(env):
    ex, store, dsn = env
    chat(store)
    ex.fail = lambda j: PermanentError("this input can never succeed")
    r = ex.execute(job("count"))
    assert (r.outcome, r.error_kind, r.retry_in) == ("dead", "permanent", None)
    ex.fail = None
    r = ex.execute(job("bad"))
    assert (r.outcome, r.error_kind) == ("dead", "config")
    assert "nowhere" in (r.error or "")


def test_timeout_is_not_retried(env):
    ex, store, dsn = env
    chat(store)
    r = ex.execute(job("slow"))
    assert (r.outcome, r.error_kind, r.retry_in) == ("dead", "timeout", None)


def test_failure_inside_the_commit_applies_nothing(env, monkeypatch):
    ex, store, dsn = env
    chat(store, content={"set": "x", "n": 1})
    chat(store, content={"set": "y", "n": 2})
    calls = []
    real = ex._emit

    def flaky(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return real(*a, **kw)

    monkeypatch.setattr(ex, "_emit", flaky)
    with pytest.raises(RuntimeError):
        ex.execute(job("keyed"))
    assert q(dsn, "SELECT count(*) FROM records WHERE collection = 'outk'") == [(0,)]
    assert q(dsn, "SELECT count(*) FROM runs") == [(0,)]
    assert q(dsn, "SELECT coalesce(max(watermark), 0) FROM derivation_cursors") == [(0,)]
