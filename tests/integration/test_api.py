"""The HTTP API on the real embedded stack: PostgreSQL, the relay, Tansu, a worker
subprocess running every role, and the API served by uvicorn in this process.

One injected clock (:class:`wakeline.clock.FileClock`) drives the worker and the
API, so seed 000's ``user:mia`` read timeline runs at its own instants
(09:00, 09:14, 09:15, 13:00) without sleeping through them.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.fixtures.streaming import Stack, make_stack
from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.api import ApiContext, ApiServer, ApiSettings
from wakeline.catalog import compile_catalog
from wakeline.clock import CLOCK_ENV, FileClock
from wakeline.core.state import EntityState
from wakeline.topology import load_topology

pytestmark = pytest.mark.integration

TOKEN_A = "token-default-3f9a"
TOKEN_B = "token-other-77c1"
OPS = "token-operator-0b2e"
MIA = "user:mia"
MOOD = {"mood_v1": {"valence": 0.1, "label": "calm"}}

SLOW_PROFILE = '''
import time
from simfuncs import echo_profile

def slow_profile(ctx):
    time.sleep(1.0)  # the run takes a moment: a read answers long before it ends
    return echo_profile(ctx)
'''


def api_catalog(tmp: Path) -> Path:
    root = catalog_dir(tmp, {
        # Seed 000's profile: read-triggered, cooldown 60 s.
        "profile": derivation("profile", "read: true\ncooldown_s: 60",
                              source="collections: [main]\n  types: [chat]",
                              function="profilefns:slow_profile", emits="[profiles]"),
        "acc": derivation("acc", "accumulator: {metric: importance, threshold: 10}",
                          source="collections: [main]\n  types: [observation]"),
        "wr": derivation("wr", "write: {}", source="collections: [relations]"),
        "qu": derivation("qu", "quiet: {types: [contradiction], after_s: 120}",
                         source="collections: [relations]"),
    })
    (root / "profilefns.py").write_text(SLOW_PROFILE)
    return root


@dataclass
class Api:
    stack: Stack
    server: ApiServer
    clock: FileClock
    a: httpx.Client
    b: httpx.Client

    @property
    def ctx(self) -> ApiContext:
        return self.server.ctx

    def state(self, entity: str, workspace: str = "default") -> EntityState | None:
        return self.ctx.view.state(workspace, entity)

    def wait_state(self, entity: str, pred: Callable[[EntityState], bool],
                   timeout: float = 30.0, what: str = "") -> EntityState:
        """Until the conditions agent's state (read from its changelog) satisfies ``pred``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.state(entity)
            if st is not None and pred(st):
                return st
            time.sleep(0.05)
        raise AssertionError(f"agent state of {entity} never reached {what}: {self.state(entity)}"
                             + "\n" + "\n".join(self.stack.workers[0].lines[-30:]))

    def wait_outcome(self, kind: str, entity: str, timeout: float = 20.0) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.stack.query("SELECT trigger, reason, detail FROM outcomes WHERE kind = %s "
                                    "AND entity = %s ORDER BY id", kind, entity)
            if rows:
                return rows
            time.sleep(0.1)
        raise AssertionError(f"no {kind} outcome for {entity}")


def _seen(seq: int, derivation: str | None = None) -> Callable[[EntityState], bool]:
    def pred(st: EntityState) -> bool:
        return seq in st.facts or any(s >= seq for s in st.unready) or any(
            ds.w >= seq for ds in st.ds.values())
    return pred


def _idle(derivation: str, watermark: int) -> Callable[[EntityState], bool]:
    def pred(st: EntityState) -> bool:
        ds = st.ds.get(derivation)
        return ds is not None and ds.w == watermark and ds.running is None
    return pred


@pytest.fixture(scope="module")
def api(pg_server: Any, tansu_broker: Any, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("api")
    clock_file = tmp / "clock"
    FileClock.write(clock_file, "2026-07-19T08:59:00Z")
    st = make_stack(pg_server, tmp, tansu_broker.bootstrap, api_catalog(tmp))
    old = os.environ.get(CLOCK_ENV)
    os.environ[CLOCK_ENV] = str(clock_file)  # inherited by the worker subprocess only
    try:
        worker = st.worker(relay=True)
    finally:
        if old is None:
            os.environ.pop(CLOCK_ENV)
        else:
            os.environ[CLOCK_ENV] = old
    worker.wait_for("conditions ready", timeout=90)
    settings_ = ApiSettings(tokens={"default": SecretStr(TOKEN_A), "other": SecretStr(TOKEN_B)},
                            operator_token=SecretStr(OPS), reply_timeout_s=10,
                            manual_timeout_s=10)
    ctx = ApiContext(load_topology(st.topology), compile_catalog(st.catalog), st.dsn,
                     st.bootstrap, settings=settings_, clock=FileClock(clock_file),
                     app_id=st.app_id)
    server = ApiServer(ctx, port=0).start()
    a = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN_A}"},
                     timeout=30)
    b = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN_B}"},
                     timeout=30)
    ctx.view.start()  # tail the changelog from now on
    try:
        yield Api(st, server, FileClock(clock_file), a, b)
    finally:
        a.close()
        b.close()
        server.stop()
        st.stop()
        st.store.close()


def chat(entity: str, slot: str, value: str, **kw: Any) -> dict[str, Any]:
    return {"entity": entity, "collection": "main", "type": "chat",
            "content": {"set": slot, "value": value}, "annotations": MOOD, "ready": True, **kw}


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()


def test_seed_user_mia_read_timeline(api: Api) -> None:
    """Seed 000's concrete timeline, with a profile derivation {read: true, cooldown_s: 60}."""
    st, a = api.stack, api.a
    first = ok(a.post("/records/batch", json={"records": [chat(MIA, "name", "Mia"),
                                                           chat(MIA, "role", "engineer")]}),
               201)["seqs"]
    api.wait_state(MIA, _seen(first[-1]), what="the first records")
    # The profile never ran: the first read is stale (never ran) and dirty.
    api.clock.set("2026-07-19T09:00:00Z")
    r = ok(a.get("/document", params={"entity": MIA, "max_staleness": 900}))
    assert r["freshness"] == [{"derivation": "profile", "last_run_at": None, "watermark": 0,
                               "dirty": True, "pending_unready": False, "job": "enqueued",
                               "error_kind": None}]
    assert r["document"] == {} and r["freshness_source"] == "conditions"
    runs = st.wait_runs(1, derivation="profile", entity=MIA)
    assert [x["trigger_reasons"] for x in runs] == [["trigger:profile.default:read"]]
    api.wait_state(MIA, _idle("profile", first[-1]), what="the 09:00 run's cursor")
    watermark_0900 = first[-1]

    # 09:14: three chat events ingest and become ready; nothing runs (no write
    # condition, and nobody read the profile).
    api.clock.set("2026-07-19T09:14:00Z")
    new = ok(a.post("/records/batch", json={"records": [
        chat(MIA, "role", "staff engineer"), chat(MIA, "timezone", "Europe/Oslo"),
        chat(MIA, "preferences", "tea")]}), 201)["seqs"]
    api.wait_state(MIA, _seen(new[-1]), what="the 09:14 records")
    time.sleep(1.0)
    assert len(st.runs("profile", MIA)) == 1

    # 09:15:00: a read returns the 09:00 profile at once, dirty, and enqueues the job.
    api.clock.set("2026-07-19T09:15:00Z")
    t0 = time.monotonic()
    r = ok(a.get("/document", params={"entity": MIA, "max_staleness": 900}))
    answered_in = time.monotonic() - t0
    runs_when_answered = len(st.runs("profile", MIA))
    assert r["freshness"] == [{"derivation": "profile", "last_run_at": "2026-07-19T09:00:00Z",
                               "watermark": watermark_0900, "dirty": True,
                               "pending_unready": False, "job": "enqueued", "error_kind": None}]
    assert r["document"]["profiles"]["role"]["content"] == {"value": "engineer"}
    # Never waits for the run: the run takes >= 1 s and had not ended when we got the answer.
    assert runs_when_answered == 1, answered_in
    job_id = r["jobs"]["profile"]

    # 09:15:02: a worker runs the derivation over the three new records.
    runs = st.wait_runs(2, derivation="profile", entity=MIA)
    assert runs[1]["job_id"] == job_id and runs[1]["records_consumed"] == 3
    assert runs[1]["watermark_before"] == watermark_0900
    assert runs[1]["watermark_after"] == new[-1]
    job = ok(a.get(f"/jobs/{job_id}"))
    assert job["state"] == "succeeded" and job["runs"] == [runs[1]["run_id"]]
    assert job["reasons"] == ["trigger:profile.default:read"] and job["source"] == "store"
    api.wait_state(MIA, _idle("profile", new[-1]), what="the 09:15 run's cursor")

    # 09:15:30: the next read returns the refreshed profile, clean, no job.
    api.clock.set("2026-07-19T09:15:30Z")
    r = ok(a.get("/document", params={"entity": MIA, "max_staleness": 900}))
    assert r["freshness"] == [{"derivation": "profile", "last_run_at": "2026-07-19T09:15:00Z",
                               "watermark": new[-1], "dirty": False, "pending_unready": False,
                               "job": None, "error_kind": None}]
    assert r["document"]["profiles"]["role"]["content"] == {"value": "staff engineer"}
    assert r["document"]["profiles"]["timezone"]["text"] == "Europe/Oslo"

    # Concurrent reads coalesce: a read stale by its own max_staleness waits out the
    # cooldown (until 09:16:00) as one queued job; a second read joins it.
    r1 = ok(a.get("/document", params={"entity": MIA, "max_staleness": 10}))
    r2 = ok(a.get("/document", params={"entity": MIA, "max_staleness": 10}))
    assert r1["freshness"][0]["job"] == "enqueued"
    assert r2["freshness"][0]["job"] == "coalesced"
    assert r1["jobs"]["profile"] == r2["jobs"]["profile"]
    queued = ok(a.get(f"/jobs/{r1['jobs']['profile']}"))
    assert queued["state"] == "queued" and queued["run_after"] == "2026-07-19T09:16:00Z"
    # A manual run joins the same job and bypasses the cooldown: it runs now.
    m = ok(a.post("/processors/profile/run", json={"entity": MIA}), 200)
    assert m == {"status": "coalesced", "job_id": r1["jobs"]["profile"], "coalesced": True,
                 "run_after": "2026-07-19T09:15:30Z", "derivation": "profile", "entity": MIA,
                 "request_id": m["request_id"]}
    runs = st.wait_runs(3, derivation="profile", entity=MIA)
    assert runs[2]["trigger_reasons"] == ["manual", "trigger:profile.default:read"]
    assert runs[2]["outcome"] == "noop" and runs[2]["job_id"] == m["job_id"]
    api.wait_state(MIA, lambda s: s.ds["profile"].running is None
                   and s.ds["profile"].last_success is not None
                   and s.ds["profile"].last_success >= api.clock.now().timestamp(),
                   what="the manual run's cursor")

    # 13:00: after hours of silence the read is clean but stale: a cheap noop run.
    api.clock.set("2026-07-19T13:00:00Z")
    r = ok(a.get("/document", params={"entity": MIA, "max_staleness": 900}))
    assert r["freshness"] == [{"derivation": "profile", "last_run_at": "2026-07-19T09:15:30Z",
                               "watermark": new[-1], "dirty": False, "pending_unready": False,
                               "job": "enqueued", "error_kind": None}]
    runs = st.wait_runs(4, derivation="profile", entity=MIA)
    assert runs[3]["outcome"] == "noop" and runs[3]["records_consumed"] == 0
    api.wait_state(MIA, lambda s: s.ds["profile"].last_success == api.clock.now().timestamp()
                   and s.ds["profile"].running is None, what="the 13:00 noop")
    r = ok(a.get("/document", params={"entity": MIA, "max_staleness": 900}))
    assert r["freshness"][0]["last_run_at"] == "2026-07-19T13:00:00Z"
    assert r["freshness"][0]["job"] is None and r["freshness"][0]["dirty"] is False
    # Without max_staleness only dirtiness revalidates.
    assert ok(a.get("/document", params={"entity": MIA}))["freshness"][0]["job"] is None


def test_runs_filters_and_pagination(api: Api) -> None:
    a = api.a
    every = ok(a.get("/runs", params={"derivation": "profile", "entity": MIA}))["runs"]
    assert len(every) >= 4
    assert [r["run_id"] for r in every] == sorted((r["run_id"] for r in every), reverse=True)
    pages: list[int] = []
    before = None
    while True:
        params: dict[str, Any] = {"derivation": "profile", "entity": MIA, "limit": 1}
        if before is not None:
            params["before"] = before
        page = ok(a.get("/runs", params=params))
        pages += [r["run_id"] for r in page["runs"]]
        before = page["next_before"]
        if before is None:
            break
    assert pages == [r["run_id"] for r in every]
    noops = ok(a.get("/runs", params={"outcome": "noop", "entity": MIA}))["runs"]
    assert noops and all(r["outcome"] == "noop" for r in noops)
    manual = ok(a.get("/runs", params={"reason": "manual"}))["runs"]
    assert [r["trigger_reasons"] for r in manual] == [["manual", "trigger:profile.default:read"]]
    late = ok(a.get("/runs", params={"since": "2026-07-19T12:00:00Z", "entity": MIA}))["runs"]
    assert [r["finished_at"] for r in late] == ["2026-07-19T13:00:00Z"]
    one = ok(a.get(f"/runs/{every[-1]['run_id']}"))
    assert one["trigger_reasons"] == ["trigger:profile.default:read"]
    assert one["definition_hashes"] and one["duration_s"] >= 0 and one["error"] is None
    assert ok(a.get("/runs/999999999"), 404)["error"]["code"] == "run.not_found"


def test_unready_record_waits_and_mark_ready_releases_it(api: Api) -> None:
    a, zoe = api.a, "user:zoe"
    seq = ok(a.post("/records", json={**chat(zoe, "role", "designer"), "ready": False}),
             201)["seq"]
    api.wait_state(zoe, _seen(seq), what="the unready record")
    r = ok(a.get("/document", params={"entity": zoe, "max_staleness": 900}))
    assert r["freshness"] == [{"derivation": "profile", "last_run_at": None, "watermark": 0,
                               "dirty": False, "pending_unready": True, "job": "enqueued",
                               "error_kind": None}]
    api.wait_outcome("pending_unready", zoe)
    assert api.stack.runs("profile", zoe) == []
    out = ok(a.post("/records/ready", json={"seqs": [seq], "annotations": {str(seq): MOOD},
                                            "scores": {str(seq): {"importance": 2}}}))
    assert out == {"ready": [seq], "already_ready": []}
    runs = api.stack.wait_runs(1, derivation="profile", entity=zoe)
    assert runs and runs[0]["records_consumed"] == 1
    assert ok(a.post("/records/ready", json={"seqs": [seq]})) == {"ready": [],
                                                                  "already_ready": [seq]}
    doc = ok(a.get("/document", params={"entity": zoe}))["document"]
    assert doc["profiles"]["role"]["content"] == {"value": "designer"}
    # Retracting a keyed value: the tombstoned key leaves the document.
    tomb = ok(a.post("/records/retract", json={"entity": zoe, "collection": "profiles",
                                               "key": "role"}), 201)["seq"]
    assert tomb > seq
    assert "profiles" not in ok(a.get("/document", params={"entity": zoe}))["document"]
    again = ok(a.post("/records/retract", json={"entity": zoe, "collection": "profiles",
                                                "key": "role"}), 409)
    assert again["error"]["code"] == "store.no_live_head" and again["error"]["field"] == "key"


def test_bad_input_is_a_4xx_naming_the_field(api: Api) -> None:
    a = api.a
    cases = [
        (a.post("/records", json={"collection": "main"}), 422, "request.invalid", "entity"),
        (a.post("/records", json={"entity": "e", "collection": "nope"}), 422,
         "collection.unknown", "collection"),
        (a.post("/records", json={"entity": "e", "collection": "profiles"}), 422,
         "record.key_required", "key"),
        (a.post("/records", json={"entity": "e", "collection": "main", "type": "x"}), 422,
         "record.type_unknown", "type"),
        (a.post("/records/batch", json={"records": [{"entity": "e", "collection": "main",
                                                     "type": "chat"},
                                                    {"entity": "e", "collection": "main",
                                                     "type": "chat", "key": "k"}]}), 422,
         "record.key_forbidden", "records.1.key"),
        (a.post("/records", json={"entity": "e\u0000", "collection": "main"}), 422,
         "request.invalid", "entity"),
        (a.post("/records", json={"entity": "e", "collection": "main", "type": "chat",
                                  "content": {"tombstone": True}}), 422,
         "record.tombstone_content", "content.tombstone"),
        (a.post("/records/ready", json={"seqs": [2**62]}), 404, "record.not_found", "seqs.0"),
        (a.post("/processors/nope/run", json={"entity": "e"}), 404, "derivation.unknown",
         "derivation"),
        (a.post("/processors/profile/run", json={"entity": "e",
                                                 "run_after": "2026-07-19T09:00:00"}), 422,
         "request.invalid", "run_after"),
        (a.get("/document", params={"entity": "e", "max_staleness": -1}), 422,
         "request.invalid", "max_staleness"),
        (a.get("/explain", params={"trigger": "nope", "entity": "e"}), 404, "trigger.unknown",
         "trigger"),
        (a.post("/triggers/wr.default/pause", json={"until": "2000-01-01T00:00:00Z"}), 422,
         "pause.until_past", "until"),
        (a.get("/runs", params={"limit": 0}), 422, "request.invalid", "limit"),
        (a.post("/records", content=b"{not json", headers={"content-type": "application/json"}),
         422, "request.invalid", None),
    ]
    for r, status, code, field in cases:
        assert r.status_code == status, (r.request.url, r.text)
        err = r.json()["error"]
        assert err["code"] == code, (r.request.url, err)
        if field is not None:
            assert err["field"] == field, (r.request.url, err)


def test_explain_says_why_not_and_lists_outcomes(api: Api) -> None:
    a, ed = api.a, "user:ed"
    obs = {"entity": ed, "collection": "main", "type": "observation", "annotations": MOOD,
           "ready": True}
    s1 = ok(a.post("/records", json={**obs, "scores": {"importance": 3}}), 201)["seq"]
    api.wait_state(ed, _seen(s1))
    deadline = time.monotonic() + 20
    while True:
        e = ok(a.get("/explain", params={"trigger": "acc.default", "entity": ed}))
        if any(o["kind"] == "below_threshold" for o in e["last_outcomes"]) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.1)
    cond = e["conditions"][0]
    assert cond["condition"] == "accumulator" and cond["holds"] is False
    assert cond["value"] == 3
    assert "10" in cond["reason"], cond
    below = [o for o in e["last_outcomes"] if o["kind"] == "below_threshold"]
    assert below and below[0]["trigger"] == "acc.default"
    assert e["derivation"] == "acc" and e["last_run"] is None and e["cursor"] is None
    s2 = ok(a.post("/records", json={**obs, "scores": {"importance": 8}}), 201)["seq"]
    runs = api.stack.wait_runs(1, derivation="acc", entity=ed)
    assert runs and runs[0]["trigger_reasons"] == ["trigger:acc.default:threshold"]
    e = ok(a.get("/explain", params={"trigger": "acc.default", "entity": ed}))
    assert e["conditions"][0]["holds"] is False
    assert "watermark" in e["conditions"][0]["reason"], e["conditions"][0]
    assert e["cursor"]["watermark"] == s2 and e["last_run"]["run_id"] == runs[0]["run_id"]


def test_pause_and_resume_are_durable_and_honoured_by_the_agent(api: Api) -> None:
    a, st = api.a, api.stack
    until = "2026-07-19T23:00:00Z"
    p = ok(a.post("/triggers/wr.default/pause", json={"reason": "maintenance",
                                                      "until": until}))
    assert p["paused"] is True and p["reason"] == "maintenance" and p["until"] == until
    assert ok(a.get("/triggers"))["paused"]["wr.default"]["reason"] == "maintenance"
    time.sleep(1.5)  # the agent reloads pauses every 0.5 s
    rel = {"entity": "e:paused", "collection": "relations", "type": "support", "ready": True}
    ok(a.post("/records", json=rel), 201)
    rows = api.wait_outcome("paused", "e:paused")
    assert rows[0][0] == "wr.default" and "maintenance" in rows[0][1]
    time.sleep(0.5)
    assert st.runs("wr", "e:paused") == []
    e = ok(a.get("/explain", params={"trigger": "wr.default", "entity": "e:paused"}))
    assert e["conditions"][0]["holds"] is True and "trigger paused" in e["conditions"][0]["waiting"]
    assert e["paused"]["reason"] == "maintenance"
    dash = ok(api.a.get("/dashboard/data", headers={"Authorization": f"Bearer {OPS}"}))
    assert [t["trigger"] for t in dash["panels"]["triggers"]["data"]["paused"]] == ["wr.default"]
    # Resume: the agent releases the pause and re-evaluates what it held back.
    assert ok(a.post("/triggers/wr.default/resume"))["was_paused"] is True
    runs = st.wait_runs(1, derivation="wr", entity="e:paused", timeout=30)
    assert [r["trigger_reasons"] for r in runs] == [["trigger:wr.default:write"]]
    assert "wr.default" not in ok(a.get("/triggers"))["paused"]
    assert ok(a.post("/triggers/wr.default/resume"))["was_paused"] is False

    # A pause with `until` ends by itself when the (injected) clock passes it.
    end = api.clock.now().timestamp() + 600
    until2 = datetime.fromtimestamp(end, UTC).isoformat().replace("+00:00", "Z")
    ok(a.post("/triggers/wr.default/pause", json={"until": until2}))
    time.sleep(1.5)
    ok(a.post("/records", json={**rel, "entity": "e:until"}), 201)
    api.wait_outcome("paused", "e:until")
    assert st.runs("wr", "e:until") == []
    api.clock.advance(601)
    runs = st.wait_runs(1, derivation="wr", entity="e:until", timeout=30)
    assert [r["trigger_reasons"] for r in runs] == [["trigger:wr.default:write"]]
    released = st.query("SELECT released_at FROM trigger_pauses WHERE trigger = 'wr.default'")
    assert released and released[0][0] is not None


def test_a_token_never_crosses_workspaces(api: Api) -> None:
    a, b = api.a, api.b
    mine = ok(a.get("/runs", params={"entity": MIA}))["runs"]
    assert mine
    run_id, job_id = mine[0]["run_id"], mine[0]["job_id"]
    assert ok(b.get("/runs"))["runs"] == []
    assert ok(b.get(f"/runs/{run_id}"), 404)["error"]["code"] == "run.not_found"
    assert ok(b.get(f"/jobs/{job_id}"), 404)["error"]["code"] == "job.not_found"
    assert ok(b.get("/document", params={"entity": MIA}))["document"] == {}
    denied = [
        b.get("/document", params={"entity": MIA, "workspace": "default"}),
        b.get("/runs", params={"workspace": "default"}),
        b.get("/explain", params={"trigger": "wr.default", "entity": MIA,
                                  "workspace": "default"}),
        b.post("/records", json={**chat(MIA, "name", "x"), "workspace": "default"}),
        b.post("/records/batch", json={"records": [{**chat(MIA, "name", "x"),
                                                    "workspace": "default"}]}),
        b.post("/processors/profile/run", json={"entity": MIA, "workspace": "default"}),
        b.post("/triggers/wr.default/pause", json={"workspace": "default"}),
        b.post("/records/retract", json={"entity": MIA, "collection": "profiles",
                                         "key": "role", "workspace": "default"}),
    ]
    for r in denied:
        assert r.status_code == 403, (r.request.url, r.text)
        assert r.json()["error"]["code"] == "auth.workspace_denied"
    a_seq = api.stack.query("SELECT max(seq) FROM records WHERE workspace = 'default'")[0][0]
    assert ok(b.post("/records/ready", json={"seqs": [a_seq]}), 404)["error"]["field"] == "seqs.0"
    # B's writes land in B: A's document of the same entity does not change.
    ok(b.post("/records", json={"entity": MIA, "collection": "profiles", "key": "role",
                                "content": {"value": "intruder"}, "ready": True}), 201)
    assert ok(b.get("/document", params={"entity": MIA}))["document"]["profiles"]["role"][
        "content"] == {"value": "intruder"}
    assert ok(a.get("/document", params={"entity": MIA}))["document"]["profiles"]["role"][
        "content"] == {"value": "staff engineer"}
    rid = ok(a.post("/processors/wr/run", json={"entity": "e:x"}), 202)["request_id"]
    assert ok(b.get(f"/requests/{rid}"), 404)["error"]["code"] == "request.not_found"
    assert ok(a.get(f"/requests/{rid}"))["kind"] == "manual"
    anon = httpx.get(api.server.url + "/runs")
    assert anon.status_code == 401 and anon.json()["error"]["code"] == "auth.missing"
    assert anon.headers["www-authenticate"].startswith("Bearer")
    bad = httpx.get(api.server.url + "/runs", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "auth.invalid"
    # Workspace tokens do not open the operator surface.
    assert b.get("/metrics").status_code == 401
    assert b.get("/dashboard/data").status_code == 401


def test_dashboard_data_shows_queued_jobs_settle_deadlines_and_timers(api: Api) -> None:
    a, ent = api.a, "e:quiet"
    ops = {"Authorization": f"Bearer {OPS}"}
    deadline = api.clock.now().timestamp() + 120
    ok(a.post("/records", json={"entity": ent, "collection": "relations",
                                "type": "contradiction", "ready": True}), 201)
    st = api.wait_state(ent, lambda s: "qu" in s.ds and s.ds["qu"].queued is not None,
                        what="a queued quiet job")
    job = st.ds["qu"].queued
    assert job is not None
    m = ok(a.get("/dashboard/data", headers=ops))["panels"]["mailbox"]
    assert m["ok"], m
    settle = m["data"]["oldest_settle_deadline"]
    assert settle["entity"] == ent and settle["job_id"] == job.id
    assert settle["reason"] == "trigger:qu.default:quiet"
    assert settle["deadline"] == datetime.fromtimestamp(deadline, UTC).isoformat().replace(
        "+00:00", "Z")
    assert m["data"]["next_due_timer"]["in_s"] <= 120
    assert m["data"]["queued"] >= 1 and m["data"]["oldest_queued"]["age_s"] >= 0
    queued = ok(a.get(f"/jobs/{job.id}"))
    assert queued["state"] == "queued" and queued["source"] == "mailbox"
    assert queued["reasons"] == ["trigger:qu.default:quiet"]
    lag = ok(a.get("/dashboard/data", headers=ops))["panels"]["consumer_lag"]["data"]
    assert lag["reliable"] is False and lag["total"] is None and "batches" in lag["note"]
    assert any(r["group"] == api.stack.app_id and r["agent"] == "conditions"
               for r in lag["partitions"])
    # The burst settles on the injected clock: one run.
    api.clock.advance(121)
    runs = api.stack.wait_runs(1, derivation="qu", entity=ent)
    assert [r["trigger_reasons"] for r in runs] == [["trigger:qu.default:quiet"]]


_SAMPLE = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? (-?[0-9.e+-]+|NaN|[+-]Inf)$'
                     r'|^# (HELP|TYPE) ')


def test_metrics_are_prometheus_text(api: Api) -> None:
    r = api.a.get("/metrics", headers={"Authorization": f"Bearer {OPS}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = r.text.strip().splitlines()
    bad = [ln for ln in lines if not _SAMPLE.match(ln)]
    assert not bad, bad
    text = r.text
    assert 'wakeline_runs_total{derivation="profile",outcome="noop"}' in text
    assert 'wakeline_run_duration_seconds_count{derivation="profile"}' in text
    assert 'wakeline_outcomes_total{kind="paused"}' in text
    assert 'wakeline_consumer_lag_reliable{broker="tansu"} 0' in text
    assert 'wakeline_consumer_committed_offset{group="' + api.stack.app_id in text
    assert 'wakeline_replication_slot_lag_bytes{slot="s_' in text
    assert 'wakeline_api_requests_total{method="GET",route="/document",status="200"}' in text
    assert 'wakeline_scrape_error{collector="mailbox"} 0' in text
    families = [ln.split()[2] for ln in lines if ln.startswith("# TYPE")]
    assert len(families) == len(set(families))
    # A family's samples are contiguous (the text format requires it).
    order = [re.split(r"[{ ]", ln)[0].removesuffix("_bucket").removesuffix("_count")
             .removesuffix("_sum") for ln in lines if not ln.startswith("#")]
    runs_of = [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k]
    assert len(runs_of) == len(set(runs_of)), runs_of


EXAMPLES = int(os.environ.get("WAKELINE_SCHEMATHESIS_EXAMPLES", "40"))


def _own_workspace(case: Any) -> None:
    if isinstance(case.query, dict) and "workspace" in case.query:
        case.query["workspace"] = "default"
    body = case.body if isinstance(case.body, dict) else {}
    if "workspace" in body:
        body["workspace"] = "default"
    for rec in body.get("records") or []:
        if isinstance(rec, dict) and "workspace" in rec:
            rec["workspace"] = "default"


def _fuzz(op: Any, mode: GenerationMode, token: str, url: str, calls: dict[str, int]) -> None:
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    def check(case: Any) -> None:
        calls[op.label] = calls.get(op.label, 0) + 1
        # A valid token, and the token's own workspace where one is named, so the
        # generated data gets past authorization to the code behind it.
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
        if mode is GenerationMode.POSITIVE:
            _own_workspace(case)
        case.call_and_validate(base_url=url,
                               checks=[not_a_server_error, response_schema_conformance])

    check()


def test_openapi_document_has_no_5xx(api: Api) -> None:
    """Schemathesis over the served OpenAPI document, every operation, with valid and
    invalid data: never a 5xx, and every answer matches the documented schema.

    (Hypothesis drives each operation's strategy directly: schemathesis's pytest
    fixture integration does not run on pytest 9.)"""
    schema = schemathesis.openapi.from_url(api.server.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) == sum(len(v) for v in api.server.app.openapi()["paths"].values())
    doc = api.server.app.openapi()["paths"]
    failures: list[str] = []
    calls: dict[str, int] = {}
    for op in operations:
        token = OPS if op.path in ("/metrics", "/dashboard/data") else TOKEN_A
        spec = doc[op.path][op.method.lower()]
        has_input = bool(spec.get("parameters") or spec.get("requestBody"))
        # An operation without parameters or body has no invalid input to send.
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if has_input \
            else (GenerationMode.POSITIVE,)
        for mode in modes:
            try:
                _fuzz(op, mode, token, api.server.url, calls)
            except Exception as exc:  # one operation's failure does not hide the others'
                failures.append(f"{op.label} ({mode.value}): {exc}"[:3000])
    assert not failures, "\n\n".join(failures)
    assert set(calls) == {op.label for op in operations}, calls
