"""Time conditions, pull and manual runs, pacing, and the coalescing mailbox."""

from __future__ import annotations

from wakeline.core.outcomes import OutcomeKind
from wakeline.testing import PermanentError, Transient
from tests.unit.core.helpers import chat, derivation, reasons, sim_for

QUIET = "quiet: {collections: [main], types: [chat], after_s: 900}"


def test_quiet_settles_and_each_arrival_pushes_the_deadline(tmp_path):
    sim = sim_for(tmp_path, {"s": derivation("s", QUIET)})
    chat(sim)
    assert sim.jobs[0]["run_after"] == "2026-07-19T09:15:00Z"
    sim.advance(600)
    chat(sim)                      # 09:10 pushes the deadline to 09:25
    assert sim.jobs[0]["run_after"] == "2026-07-19T09:25:00Z"
    sim.advance(899)
    assert sim.runs == []
    sim.advance(1)
    assert reasons(sim) == [["trigger:s.default:quiet"]]
    assert sim.runs[0]["records_consumed"] == 2 and sim.runs[0]["finished_at"] == "2026-07-19T09:25:00Z"


def test_quiet_max_wait_runs_a_burst_that_never_settles(tmp_path):
    sim = sim_for(tmp_path, {"s": derivation(
        "s", "quiet: {collections: [main], after_s: 900, max_wait_s: 3600}")})
    for _ in range(20):            # one message every 5 minutes for 100 minutes
        chat(sim)
        sim.advance(300)
    assert sim.runs and sim.runs[0]["finished_at"] == "2026-07-19T10:00:00Z"


def test_write_pulls_a_quiet_job_earlier(tmp_path):
    """A non-settle stimulus with an earlier permitted time pulls the shared job earlier."""
    sim = sim_for(tmp_path, {"s": derivation("s", QUIET)}, triggers={"s.urgent": """
        name: s.urgent
        processor: s
        write: {where: {urgent: {eq: true}}}
    """})
    chat(sim)
    sim.advance(60)
    assert sim.runs == []
    chat(sim, content={"urgent": True})
    assert reasons(sim) == [["trigger:s.default:quiet", "trigger:s.urgent:write"]]
    assert sim.runs[0]["records_consumed"] == 2


def test_three_triggers_one_run(tmp_path):
    sim = sim_for(tmp_path, {"p": derivation(
        "p", "accumulator: {metric: importance, threshold: 10}\nwrite: {}", extra="")},
        triggers={"p.boot": "name: p.boot\nprocessor: p\nlifecycle: {first_record: true}\n"})
    chat(sim, scores={"importance": 12})
    assert reasons(sim) == [["trigger:p.boot:lifecycle", "trigger:p.default:threshold",
                             "trigger:p.default:write"]]
    assert len(sim.runs) == 1


def test_cooldown_pushes_run_after_and_manual_bypasses_it(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {}\ncooldown_s: 300")})
    chat(sim)
    assert len(sim.runs) == 1
    sim.advance(10)
    chat(sim)
    assert len(sim.runs) == 1
    cooling = sim.outcomes_of(OutcomeKind.COOLDOWN)[-1]
    assert cooling.detail["until"] == "2026-07-19T09:05:00Z"
    assert sim.jobs[0]["run_after"] == "2026-07-19T09:05:00Z"
    ex = sim.explain("d.default", "user:mia")["conditions"][0]
    assert ex["holds"] and "cooling until 2026-07-19T09:05:00Z" in ex["waiting"]
    job = sim.manual("d", "user:mia")
    assert job["coalesced"] is True and job["run_after"] == "2026-07-19T09:00:10Z"
    assert reasons(sim)[-1] == ["manual", "trigger:d.default:write"]


def test_manual_without_trigger_and_run_after(tmp_path):
    sim = sim_for(tmp_path, {"m": derivation("m", None)})
    chat(sim)
    job = sim.manual("m", "user:mia", run_after="2026-07-19T10:00:00Z")
    assert job == {"job_id": job["job_id"], "coalesced": False, "run_after": "2026-07-19T10:00:00Z"}
    again = sim.manual("m", "user:mia")
    assert again["job_id"] == job["job_id"] and again["coalesced"] is True
    assert again["run_after"] == "2026-07-19T09:00:00Z", "the earliest permitted time wins"
    assert reasons(sim) == [["manual"]]


def test_debounce_extends_while_stimuli_keep_arriving(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {}\ndebounce_s: 30")})
    for _ in range(5):
        chat(sim)
        sim.advance(20)
    assert sim.runs == []
    deb = sim.outcomes_of(OutcomeKind.DEBOUNCE)[-1]
    assert deb.detail["until"] == "2026-07-19T09:01:50Z"
    sim.advance(10)
    assert len(sim.runs) == 1 and sim.runs[0]["records_consumed"] == 5
    assert sim.runs[0]["finished_at"] == "2026-07-19T09:01:50Z"


def test_debounce_max_wait(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {}\ndebounce_s: 30\nmax_wait_s: 60")})
    for _ in range(10):
        chat(sim)
        sim.advance(20)
    assert sim.runs and sim.runs[0]["finished_at"] == "2026-07-19T09:01:00Z"


def test_debounce_does_not_delay_read_or_at(tmp_path):
    sim = sim_for(tmp_path, {"p": derivation("p", "read: true\nwrite: {}\ndebounce_s: 600")})
    chat(sim)
    assert sim.runs == [] and sim.jobs[0]["run_after"] == "2026-07-19T09:10:00Z"
    fresh = sim.read("user:mia")
    assert fresh[0]["dirty"] and fresh[0]["job"] == "coalesced"
    assert reasons(sim) == [["trigger:p.default:read", "trigger:p.default:write"]], \
        "the read is never debounced and pulls the debounced write along"


def test_stimuli_during_a_run_make_exactly_one_successor(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {}")}, run_duration=5)
    chat(sim)
    assert sim.jobs[0]["state"] == "running"
    sim.advance(1)
    for _ in range(3):
        chat(sim)
    jobs = sim.jobs
    assert [j["state"] for j in jobs] == ["running", "queued"], "one running + one queued"
    sim.advance(10)
    assert len(sim.runs) == 2
    assert [r["records_consumed"] for r in sim.runs] == [1, 3]
    assert sim.jobs == []


def test_successor_is_dropped_when_its_reason_was_consumed(tmp_path):
    """Post-run re-evaluation: a queued reason whose data the run consumed does not run again."""
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {}\ncooldown_s: 60")})
    chat(sim)
    sim.advance(5)
    chat(sim)                           # cooling: queued until 09:01
    sim.manual("d", "user:mia")         # the manual run consumes it now
    assert len(sim.runs) == 2 and sim.jobs == []


def test_at_fires_at_the_records_datetime_and_rearms(tmp_path):
    src = "collections: [calendar]"
    sim = sim_for(tmp_path, {"r": derivation(
        "r", "at: {collections: [calendar], field: starts_at, offset_s: -3600}",
        source=src, mode="current")})
    sim.write(entity="e", collection="calendar", key="standup",
              content={"title": "standup", "starts_at": "2026-07-19T12:00:00Z"})
    sim.write(entity="e", collection="calendar", key="review",
              content={"title": "review", "starts_at": "2026-07-19T15:00:00Z"})
    runs_now = len(sim.runs)   # the write of the calendar rows themselves does not run `at`
    assert sim.jobs[-1]["run_after"] == "2026-07-19T11:00:00Z"
    sim.advance(2 * 3600 - 1)
    assert len(sim.runs) == runs_now
    sim.advance(1)
    assert sim.runs[-1]["trigger_reasons"] == ["trigger:r.default:at"]
    assert sim.runs[-1]["finished_at"] == "2026-07-19T11:00:00Z"
    assert sim.jobs[-1]["run_after"] == "2026-07-19T14:00:00Z", "the next deadline re-arms"
    # moving the dated record re-arms it; its tombstone would cancel it
    sim.write(entity="e", collection="calendar", key="review",
              content={"title": "review", "starts_at": "2026-07-19T16:00:00Z"})
    assert sim.jobs[-1]["run_after"] == "2026-07-19T15:00:00Z"
    sim.retract(entity="e", collection="calendar", key="review")
    assert [j for j in sim.jobs if j["derivation"] == "r"] == []
    sim.advance(10 * 3600)
    assert [r["finished_at"] for r in sim.runs if "trigger:r.default:at" in r["trigger_reasons"]] \
        == ["2026-07-19T11:00:00Z"]


def test_at_deadline_in_the_past_is_handled_by_any_successful_run(tmp_path):
    sim = sim_for(tmp_path, {"r": derivation(
        "r", "at: {collections: [calendar], field: starts_at}", source="collections: [calendar]",
        mode="snapshot")}, triggers={"r.w": "name: r.w\nprocessor: r\nwrite: {}\n"})
    sim.write(entity="e", collection="calendar", key="old",
              content={"starts_at": "2026-07-19T08:00:00Z"})
    # the write trigger ran at 09:00, which handles the 08:00 deadline too
    assert len(sim.runs) == 1
    assert sorted(sim.runs[0]["trigger_reasons"]) == ["trigger:r.default:at", "trigger:r.w:write"]
    sim.advance(3600)
    assert len(sim.runs) == 1


def test_event_row_update_rearms_and_delete_cancels_at(tmp_path):
    sim = sim_for(tmp_path, {"r": derivation(
        "r", "at: {collections: [main], field: when}", mode="snapshot")})
    seq = chat(sim, content={"when": "2026-07-19T10:00:00Z"})
    sim.advance(1)
    runs = len(sim.runs)
    assert [j["run_after"] for j in sim.jobs] == ["2026-07-19T10:00:00Z"]
    rec = sim.records[seq]
    sim.update(seq, content={**rec.content, "when": "2026-07-19T11:00:00Z"})
    assert [j["run_after"] for j in sim.jobs] == ["2026-07-19T11:00:00Z"]
    sim.delete(seq)
    assert sim.jobs == []
    sim.advance(5 * 3600)
    assert len(sim.runs) == runs


def test_cron_dirty_and_any_dedupe_and_catch_up(tmp_path):
    sim = sim_for(tmp_path, {
        "n": derivation("n", "cron: {expr: '0 3 * * *', entities: dirty}"),
        "a": derivation("a", "cron: {expr: '0 * * * *', entities: any}", extra="source_allow: x\n"
                        if False else ""),
    }, start="2026-07-19T09:30:00Z")
    chat(sim, entity="user:b")
    chat(sim, entity="user:a")
    sim.advance(30 * 60)  # 10:00 bucket of the hourly `any` schedule
    hourly = [r for r in sim.runs if r["derivation"] == "a"]
    assert [r["entity"] for r in hourly] == ["user:a", "user:b"], "entities in lexical order"
    assert hourly[0]["trigger_reasons"] == ["trigger:a.default:cron"]
    sim.advance(17 * 3600)  # through 03:00 next day
    nightly = [r for r in sim.runs if r["derivation"] == "n"]
    assert [r["entity"] for r in nightly] == ["user:a", "user:b"]
    assert sim.outcomes_of(OutcomeKind.CRON_CLEAN) == [], "clean entities are not scanned"
    # downtime: 10 hourly buckets missed, at most 3 catch up, the rest recorded
    before = len([r for r in sim.runs if r["derivation"] == "a"])
    sim.advance(10 * 3600 + 5, down=True)
    missed = sim.outcomes_of(OutcomeKind.MISSED_CRON)
    assert len(missed) == 7
    pages = [p for p in sim.cron_pages if p["trigger"] == "a.default"]
    assert pages[-1]["dedupe"].startswith("cron:a:")
    after = len([r for r in sim.runs if r["derivation"] == "a"])
    assert after - before == 2, "3 buckets catch up; they coalesce into one run per entity"
    assert len([p for p in pages if p["bucket"] == pages[-1]["bucket"]]) == 1


def test_cron_bucket_delivered_twice_enqueues_once(tmp_path):
    from wakeline.core.events import CronFire
    sim = sim_for(tmp_path, {"n": derivation("n", "cron: {expr: '0 3 * * *', entities: any}")},
                  start="2026-07-19T02:59:00Z")
    chat(sim)
    sim.advance(60)
    assert len(sim.runs) == 1
    sim._apply("user:mia", CronFire("n.default", sim.now.timestamp() - 0))
    assert sim.outcomes_of(OutcomeKind.DUPLICATE_CRON)


def test_new_cron_schedule_starts_at_latest_due_bucket(tmp_path):
    sim = sim_for(tmp_path, {"n": derivation("n", "cron: {expr: '0 * * * *', entities: any}")},
                  start="2026-07-19T09:30:00Z")
    assert sim.cron_pages == [], "no replay of history, not even the latest due bucket"
    sim.advance(30 * 60)
    assert [p["bucket"] for p in sim.cron_pages] == ["2026-07-19T10:00:00Z"]


def test_read_timeline_from_the_seed(tmp_path):
    """profile: {read: true, cooldown_s: 60}, last success 09:00 through seq 40."""
    sim = sim_for(tmp_path, {"profile": derivation("profile", "read: true\ncooldown_s: 60")},
                  start="2026-07-19T08:59:00Z")
    for _ in range(40):
        chat(sim)
    sim.advance(60)
    sim.manual("profile", "user:mia")
    assert sim.cursor("profile", "user:mia")["watermark"] == 40
    assert sim.runs[-1]["finished_at"] == "2026-07-19T09:00:00Z"
    sim.advance(14 * 60)                         # 09:14: three chat events, nothing runs
    seqs = [chat(sim) for _ in range(3)]
    assert seqs == [41, 42, 43] and len(sim.runs) == 1
    sim.advance(60)                              # 09:15:00 a read
    fresh = sim.read("user:mia", max_staleness=900)
    assert fresh == [{"derivation": "profile", "last_run_at": "2026-07-19T09:00:00Z",
                      "watermark": 40, "dirty": True, "pending_unready": False,
                      "job": "enqueued", "error_kind": None}]
    assert sim.runs[-1]["watermark_after"] == 43
    fresh = sim.read("user:mia", max_staleness=900)
    assert fresh[0]["dirty"] is False and fresh[0]["job"] is None
    sim.advance(int((13 - 9.25) * 3600))         # 13:00, hours of silence
    fresh = sim.read("user:mia", max_staleness=900)
    assert fresh[0]["dirty"] is False and fresh[0]["job"] == "enqueued"
    assert sim.runs[-1]["outcome"] == "noop"
    assert sim.cursor("profile", "user:mia")["last_success_at"] == "2026-07-19T13:00:00Z"
    assert sim.read("user:mia")[0]["job"] is None, "omitting max_staleness: only dirtiness"


def test_concurrent_reads_coalesce(tmp_path):
    sim = sim_for(tmp_path, {"profile": derivation("profile", "read: true\ncooldown_s: 60")})
    chat(sim)
    sim.manual("profile", "user:mia")
    chat(sim)
    a = sim.read("user:mia")
    b = sim.read("user:mia")
    assert (a[0]["job"], b[0]["job"]) == ("enqueued", "coalesced")
    sim.advance(60)
    assert len(sim.runs) == 2


def test_pending_unready_waits_and_says_so(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {}")})
    first = chat(sim)
    assert len(sim.runs) == 1
    blocked = chat(sim, ready=False)
    chat(sim)
    assert len(sim.runs) == 1, "the job waits: its oldest pending input is unready"
    wait = sim.outcomes_of(OutcomeKind.PENDING_UNREADY)[-1]
    assert wait.detail["seq"] == blocked
    assert sim.read("user:mia") == []  # no read-triggered derivation here
    ex = sim.explain("d.default", "user:mia")["conditions"][0]
    assert f"waiting on unready seq {blocked}" in ex["waiting"]
    sim.advance(301)
    assert sim.outcomes_of(OutcomeKind.UNREADY_STALLED)[-1].detail["seq"] == blocked
    sim.mark_ready(blocked)
    assert len(sim.runs) == 2 and sim.runs[-1]["records_consumed"] == 2
    assert first < blocked


def test_watermark_stops_below_an_unready_record(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", None)})
    a = chat(sim)
    b = chat(sim, ready=False)
    chat(sim)
    sim.manual("d", "user:mia")
    assert sim.runs[-1]["watermark_after"] == a and sim.runs[-1]["records_consumed"] == 1
    assert b > a


def test_read_reports_pending_unready(tmp_path):
    sim = sim_for(tmp_path, {"p": derivation("p", "read: true")})
    chat(sim, ready=False)
    fresh = sim.read("user:mia", max_staleness=60)
    assert fresh[0]["pending_unready"] is True and fresh[0]["job"] == "enqueued"
    assert sim.runs == []


def test_transient_failures_retry_with_backoff_then_die(tmp_path):
    attempts = []

    def fail(derivation, entity, attempt):
        attempts.append((attempt, sim.now.isoformat()))
        return Transient("model overloaded")

    sim = sim_for(tmp_path, {"p": derivation("p", "read: true")}, fail=fail, max_attempts=3)
    chat(sim)
    sim.read("user:mia")
    sim.advance(10)
    assert [a for a, _ in attempts] == [1, 2, 3]
    assert [t for _, t in attempts][1:] == ["2026-07-19T09:00:02+00:00",
                                            "2026-07-19T09:00:06+00:00"], "2 s, then 4 s"
    assert [r["outcome"] for r in sim.runs] == ["failed", "failed", "dead"]
    assert sim.outcomes_of(OutcomeKind.DEAD)
    sim.fail = None
    assert sim.read("user:mia")[0]["job"] == "enqueued"  # still dirty: a new job
    assert sim.runs[-1]["outcome"] == "succeeded"


def test_permanent_failure_is_not_retried_and_dead_is_reported(tmp_path):
    sim = sim_for(tmp_path, {"p": derivation("p", "read: true")},
                  fail=lambda d, e, a: PermanentError("bad input"))
    chat(sim)
    sim.read("user:mia")
    assert [r["outcome"] for r in sim.runs] == ["dead"]
    assert sim.runs[0]["error_kind"] == "permanent"
    sim.fail = None
    fresh = sim.read("user:mia", max_staleness=None)
    assert fresh[0]["job"] == "enqueued"


def test_dead_job_reported_until_success(tmp_path):
    sim = sim_for(tmp_path, {"p": derivation("p", "read: true")},
                  fail=lambda d, e, a: PermanentError("boom"))
    sim.read("user:mia", max_staleness=1)          # never ran: stale → runs → dead (noop? no)
    chat(sim)
    sim.read("user:mia")
    assert sim.runs[-1]["outcome"] == "dead"
    sim.write(entity="other", collection="out", type="x", content={"n": 1})
    assert sim.read("user:mia")[0]["error_kind"] == "dead"


def test_pause_records_outcome_and_resume_catches_up(tmp_path):
    sim = sim_for(tmp_path, {"d": derivation("d", "write: {}")})
    sim.pause("d.default", reason="maintenance")
    chat(sim)
    assert sim.runs == []
    assert sim.outcomes_of(OutcomeKind.PAUSED)[-1].reason == "trigger paused: maintenance"
    ex = sim.explain("d.default", "user:mia")["conditions"][0]
    assert "trigger paused" in ex["waiting"]
    sim.resume("d.default")
    assert len(sim.runs) == 1


def test_noop_run_for_clean_stale_revalidation(tmp_path):
    sim = sim_for(tmp_path, {"p": derivation("p", "read: true")})
    sim.read("user:mia", max_staleness=60)
    assert [r["outcome"] for r in sim.runs] == ["noop"]
    assert sim.outcomes_of(OutcomeKind.NOOP)


def test_cron_scan_pages_entities_in_lexical_order_500_a_page(tmp_path):
    sim = sim_for(tmp_path, {"n": derivation("n", "cron: {expr: '0 3 * * *', entities: any}",
                                             extra="")}, start="2026-07-19T02:00:00Z")
    names = [f"user:{i:04d}" for i in range(1200)]
    for name in reversed(names):
        sim.write(entity=name, collection="relations", type="support", content={"topic": "t"})
    sim.write(entity="_system:audit", collection="relations", type="support", content={})
    sim.advance(3600)
    pages = [p for p in sim.cron_pages if p["bucket"] == "2026-07-19T03:00:00Z"]
    assert [p["entities"] for p in pages] == [500, 500, 200]
    assert len({p["dedupe"] for p in pages}) == 1 and pages[0]["dedupe"] == "cron:n:2026-07-19T03:00:00Z"
    ran = [r["entity"] for r in sim.runs if "trigger:n.default:cron" in r["trigger_reasons"]]
    assert ran == names, "every non-system entity, in lexical order"


def test_wakeup_and_running_in_one_pass(tmp_path):
    """What the state changelog carries ahead of a state: the earliest of the queued,
    not running jobs' run_after (unless an unready record gates the job) and of the
    unready records' alert instants not yet alerted; and whether any job runs."""
    from wakeline.core.state import DState, EntityState, Job

    sim = sim_for(tmp_path, {"a": derivation("a", "write: {}"),
                             "b": derivation("b", "write: {}")})
    eng = sim.engine
    st = EntityState("ws", "e")
    assert eng.wakeup_and_running(st) == (None, False) and eng.next_wakeup(st) is None
    st.ds["a"] = DState(queued=Job("j1", {"r": 500.0, "s": 300.0}, 0.0))
    st.ds["b"] = DState(queued=Job("j2", {"r": 200.0}, 0.0), running=Job("j0", {}, 0.0))
    # b's queued job waits for its running one: no wake-up from it, but a run is in flight
    assert eng.wakeup_and_running(st) == (300.0, True) and eng.next_wakeup(st) == 300.0
    st.unready[7] = [100.0, (eng.plan.derivations["b"].index,)]  # gates b only
    alert = 100.0 + eng.unready_alert_s
    assert eng.wakeup_and_running(st) == (min(300.0, alert), True)
    st.alerted.append(7)
    assert eng.wakeup_and_running(st) == (300.0, True)
    st.ds["b"].running = None
    st.alerted.clear()
    # b's job is now gated by the unready seq 7 (nothing of b is pending below it)
    assert eng.wakeup_and_running(st) == (min(300.0, alert), False)
    st.unready[8] = [0.0, (eng.plan.derivations["a"].index,)]  # gates a too
    assert eng.wakeup_and_running(st) == (min(alert, eng.unready_alert_s), False)
