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


# -- batches: execute_batch ---------------------------------------------------------------

BATCH_FUNCS = '''
import time

def sleepy(ctx):
    time.sleep(0.3)
    return []

def nul(ctx):
    # PostgreSQL text cannot hold NUL: this job's write fails in SQL.
    return [{"collection": "out", "type": "run", "content": {"n": len(ctx.records)},
             "text": "a\\x00b"}]
'''

ENTITIES = [f"user:{c}" for c in "abcde"]


@pytest.fixture
def batch_env(tmp_path, pg_dsn):
    root = catalog_dir(tmp_path, {
        "count": derivation("count", "write: {}", function="simfuncs:count", emits="[out]"),
        "keyed": derivation("keyed", None, function="extra:keyed", emits="[outk]"),
        "slow": derivation("slow", None, function="extra:slow", extra="timeout_s: 1\n"),
        "bad": derivation("bad", None, function="extra:bad", emits="[out]"),
        "nul": derivation("nul", None, function="batchfuncs:nul", emits="[out]"),
        "sleepy": derivation("sleepy", None, function="batchfuncs:sleepy"),
    })
    (root / "extra.py").write_text(EXTRA)
    (root / "batchfuncs.py").write_text(BATCH_FUNCS)
    catalog = compile_catalog(root)
    migrate(pg_dsn)
    store = Store.connect(pg_dsn)
    ex = DeriveExecutor(catalog, pg_dsn, max_attempts=3)
    yield ex, store, pg_dsn
    ex.close()
    store.close()


def write(store, entity, **kw):
    kw.setdefault("ready", True)
    return store.insert_record(workspace="default", entity=entity, collection="main",
                               type="chat", **kw)


def bjob(derivation, entity, n=1, attempt=1):
    return JobSpec(f"default/{derivation}/{entity}/{n}", "default", derivation, entity,
                   ("manual",), attempt=attempt)


def by_entity(dsn, sql, *args):
    return dict(q(dsn, sql, *args))


def test_batch_commits_every_job_in_one_transaction(batch_env):
    ex, store, dsn = batch_env
    seqs = {e: write(store, e) for e in ENTITIES}
    answers = ex.execute_batch([bjob("count", e) for e in ENTITIES])
    assert [a.outcome for a in answers] == ["succeeded"] * 5
    assert [a.job_id for a in answers] == [bjob("count", e).job_id for e in ENTITIES]
    assert by_entity(dsn, "SELECT entity, watermark FROM derivation_cursors") == seqs
    assert by_entity(dsn, "SELECT entity, state FROM jobs") == {e: "succeeded" for e in ENTITIES}
    outs = q(dsn, "SELECT r.entity, o.produced_by_run = r.run_id FROM records o JOIN runs r "
                  "ON r.entity = o.entity WHERE o.collection = 'out'")
    assert sorted(outs) == [(e, True) for e in ENTITIES]
    assert {a.run_id for a in answers} == {r for (r,) in q(dsn, "SELECT run_id FROM runs")}
    assert all(len(a.emitted) == 1 for a in answers)
    # one transaction wrote every run, output and cursor of the batch
    assert q(dsn, "SELECT count(DISTINCT xmin::text) FROM runs") == [(1,)]
    assert q(dsn, "SELECT count(DISTINCT xmin::text) FROM derivation_cursors") == [(1,)]


def test_a_failing_job_in_a_batch_does_not_hold_back_the_others(batch_env):
    ex, store, dsn = batch_env
    for e in ENTITIES:
        write(store, e)
    ex.fail = lambda j: TransientError("model overloaded") if j.entity == "user:c" else None
    jobs = [bjob("count", e) for e in ENTITIES if e != "user:d"] + [bjob("bad", "user:d")]
    answers = {a.job_id: a for a in ex.execute_batch(jobs)}
    failed = answers[bjob("count", "user:c").job_id]
    assert (failed.outcome, failed.error_kind, failed.retry_in) == ("failed", "transient", 2.0)
    bad = answers[bjob("bad", "user:d").job_id]
    assert (bad.outcome, bad.error_kind, bad.retry_in) == ("dead", "config", None)
    assert sorted(a.outcome for a in answers.values()) == ["dead", "failed"] + ["succeeded"] * 3
    assert by_entity(dsn, "SELECT entity, outcome FROM runs") == {
        "user:a": "succeeded", "user:b": "succeeded", "user:c": "failed", "user:d": "dead",
        "user:e": "succeeded"}
    assert q(dsn, "SELECT count(*) FROM records WHERE collection = 'out'") == [(3,)]
    assert by_entity(dsn, "SELECT entity, last_outcome FROM derivation_cursors") == {
        "user:a": "succeeded", "user:b": "succeeded", "user:d": "dead", "user:e": "succeeded"}
    assert by_entity(dsn, "SELECT entity, state FROM jobs WHERE derivation = 'count'")[
        "user:c"] == "retrying"
    # the retry (next attempt) applies
    ex.fail = None
    [retry] = ex.execute_batch([bjob("count", "user:c", attempt=2)])
    assert (retry.outcome, retry.records_consumed) == ("succeeded", 1)
    assert by_entity(dsn, "SELECT entity, state FROM jobs WHERE derivation = 'count'")[
        "user:c"] == "succeeded"


def test_a_write_failing_in_sql_fails_only_its_job(batch_env):
    ex, store, dsn = batch_env
    for e in ENTITIES:
        write(store, e)
    jobs = [bjob("count", "user:a"), bjob("nul", "user:b"), bjob("count", "user:c")]
    a, b, c = ex.execute_batch(jobs)
    assert (a.outcome, c.outcome) == ("succeeded", "succeeded")
    assert isinstance(b, psycopg.Error)  # an infrastructure failure: nothing applied
    assert by_entity(dsn, "SELECT entity, outcome FROM runs") == {
        "user:a": "succeeded", "user:c": "succeeded"}
    assert by_entity(dsn, "SELECT entity, count(*) FROM records WHERE collection = 'out' "
                          "GROUP BY entity") == {"user:a": 1, "user:c": 1}
    assert by_entity(dsn, "SELECT derivation, count(*) FROM derivation_cursors "
                          "GROUP BY derivation") == {"count": 2}
    with pytest.raises(psycopg.Error):
        ex.execute(bjob("nul", "user:b"))
    assert q(dsn, "SELECT count(*) FROM runs WHERE derivation = 'nul'") == [(0,)]


def test_a_job_racing_its_first_delivery_is_a_duplicate_and_the_others_commit(batch_env):
    ex, store, dsn = batch_env
    for e in ENTITIES:
        write(store, e)
    # Another worker is committing the same job attempt (its run row exists): the
    # batch's transaction fails on it, and each job is committed alone.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (job_id, attempt, workspace, derivation, entity, outcome, "
                     "started_at, finished_at) VALUES (%s, 1, 'default', 'count', 'user:b', "
                     "'succeeded', now(), now())", (bjob("count", "user:b").job_id,))
    answers = ex.execute_batch([bjob("count", e) for e in ENTITIES])
    assert [a.outcome for a in answers] == ["succeeded", "duplicate"] + ["succeeded"] * 3
    assert q(dsn, "SELECT count(*) FROM runs") == [(5,)]
    assert by_entity(dsn, "SELECT entity, count(*) FROM records WHERE collection = 'out' "
                          "GROUP BY entity") == {e: 1 for e in ENTITIES if e != "user:b"}


def test_a_redelivered_batch_never_applies_twice(batch_env):
    ex, store, dsn = batch_env
    for e in ENTITIES:
        write(store, e)
    first = [bjob("count", e) for e in ENTITIES]
    assert {a.outcome for a in ex.execute_batch(first)} == {"succeeded"}
    for e in ENTITIES:
        write(store, e)
    again = ex.execute_batch(first)
    assert [a.outcome for a in again] == ["duplicate"] * 5
    assert q(dsn, "SELECT count(*) FROM runs") == [(5,)]
    assert q(dsn, "SELECT count(*) FROM records WHERE collection = 'out'") == [(5,)]
    # redelivered jobs mixed with their successors: only the successors apply
    mixed = ex.execute_batch(first[:2] + [bjob("count", e, n=2) for e in ENTITIES])
    assert [a.outcome for a in mixed] == ["duplicate"] * 2 + ["succeeded"] * 5
    assert q(dsn, "SELECT count(*) FROM runs") == [(10,)]
    assert q(dsn, "SELECT count(*) FROM records WHERE collection = 'out'") == [(10,)]
    assert q(dsn, "SELECT sum(advance_count) FROM derivation_cursors") == [(10,)]


def test_a_moved_cursor_in_a_batch_writes_nothing_for_its_job(batch_env):
    ex, store, dsn = batch_env
    for e in ENTITIES:
        write(store, e)
    ex.execute_batch([bjob("count", e) for e in ENTITIES])
    for e in ENTITIES:
        write(store, e)

    def move_b(j):
        # Between the read and the commit another run of b's mailbox advanced it.
        if j.entity == "user:b":
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("UPDATE derivation_cursors SET watermark = watermark + 1000 "
                             "WHERE entity = 'user:b'")
        return None

    ex.fail = move_b
    answers = ex.execute_batch([bjob("count", e, n=2) for e in ENTITIES])
    moved = answers[1]
    assert (moved.outcome, moved.error_kind, moved.retry_in) == ("failed", "transient", 2.0)
    assert "cursor moved during the run" in (moved.error or "")
    assert [a.outcome for a in answers if a is not moved] == ["succeeded"] * 4
    assert by_entity(dsn, "SELECT entity, count(*) FROM records WHERE collection = 'out' "
                          "GROUP BY entity") == {
        "user:a": 2, "user:b": 1, "user:c": 2, "user:d": 2, "user:e": 2}
    assert by_entity(dsn, "SELECT entity, outcome FROM runs WHERE job_id LIKE %s", "%/2") == {
        "user:a": "succeeded", "user:b": "failed", "user:c": "succeeded",
        "user:d": "succeeded", "user:e": "succeeded"}
    assert by_entity(dsn, "SELECT entity, advance_count FROM derivation_cursors") == {
        "user:a": 2, "user:b": 1, "user:c": 2, "user:d": 2, "user:e": 2}


def test_a_timeout_in_a_batch_is_its_job_only(batch_env):
    ex, store, dsn = batch_env
    for e in ENTITIES:
        write(store, e)
    a, slow, c = ex.execute_batch([bjob("count", "user:a"), bjob("slow", "user:b"),
                                   bjob("count", "user:c")])
    assert (slow.outcome, slow.error_kind, slow.retry_in) == ("dead", "timeout", None)
    assert (a.outcome, c.outcome) == ("succeeded", "succeeded")
    assert by_entity(dsn, "SELECT derivation, last_outcome FROM derivation_cursors "
                          "WHERE entity = 'user:b'") == {"slow": "dead"}
    assert by_entity(dsn, "SELECT entity, count(*) FROM records WHERE collection = 'out' "
                          "GROUP BY entity") == {"user:a": 1, "user:c": 1}
    # the worker goes on after the abandoned call
    [after] = ex.execute_batch([bjob("count", "user:d")])
    assert after.outcome == "succeeded"


def test_jobs_of_one_mailbox_in_a_batch_run_one_after_the_other(batch_env):
    ex, store, dsn = batch_env
    write(store, "user:a")
    write(store, "user:b")
    answers = ex.execute_batch([bjob("count", "user:a"), bjob("count", "user:a"),
                                bjob("count", "user:b"), bjob("count", "user:a", n=2)])
    assert [a.outcome for a in answers] == ["succeeded", "duplicate", "succeeded", "noop"]
    assert answers[3].watermark_before == answers[0].watermark_after
    assert q(dsn, "SELECT count(*) FROM runs") == [(3,)]


def test_retractions_in_a_batch_keep_each_jobs_emission_order(batch_env):
    ex, store, dsn = batch_env
    for e in ENTITIES[:3]:
        write(store, e, content={"set": "x", "n": 1})
    write(store, "user:a", content={"unset": "x"})  # a: value then tombstone, one run
    answers = ex.execute_batch([bjob("keyed", e) for e in ENTITIES[:3]])
    assert [len(a.emitted) for a in answers] == [2, 1, 1]
    rows = q(dsn, "SELECT entity, seq, tombstone, parents FROM records WHERE collection = 'outk' "
                  "ORDER BY seq")
    a_rows = [r for r in rows if r[0] == "user:a"]
    assert [r[2] for r in a_rows] == [False, True] and a_rows[1][3] == [a_rows[0][1]]
    assert answers[0].emitted == [r[1] for r in a_rows]
    write(store, "user:b", content={"unset": "x"})
    write(store, "user:c", content={"set": "x", "n": 2})
    b2, c2 = ex.execute_batch([bjob("keyed", "user:b", n=2), bjob("keyed", "user:c", n=2)])
    heads = q(dsn, "SELECT entity, tombstone, content FROM records WHERE collection = 'outk' "
                   "AND seq = ANY(%s) ORDER BY entity", b2.emitted + c2.emitted)
    assert heads == [("user:b", True, {"tombstone": True}), ("user:c", False, {"n": 2})]


def test_each_run_of_a_batch_finishes_when_its_own_call_ended(batch_env):
    ex, store, dsn = batch_env
    write(store, "user:a")
    write(store, "user:b")
    fast, slow = ex.execute_batch([bjob("count", "user:a"), bjob("sleepy", "user:b")])
    assert (fast.outcome, slow.outcome) == ("succeeded", "succeeded")
    assert fast.started_at == slow.started_at  # claimed together
    assert (slow.finished_at - fast.finished_at).total_seconds() >= 0.25
    assert by_entity(dsn, "SELECT derivation, finished_at FROM runs") == {
        "count": fast.finished_at, "sleepy": slow.finished_at}
