"""The API without services: settings, validation, auth and error shapes on the real
ASGI app (requests refused before any database access), the OpenAPI document, the
agent's reply built from a real core step, the injected file clock."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.api import ApiContext, ApiSettings, create_app, load_settings
from wakeline.api import ops as api_ops
from wakeline.api.config import ApiConfigInvalid
from wakeline.api.models import ManualRunIn, MarkReadyIn, RecordIn
from wakeline.api.routes.ops import _Text
from wakeline.catalog import compile_catalog
from wakeline.clock import FileClock, clock_from_env
from wakeline.core.build import build_plan
from wakeline.core.engine import Engine
from wakeline.core.events import ManualRun, Read, RecordChanged
from wakeline.core.plan import Rec
from wakeline.core.state import EntityState
from wakeline.streams import replies
from wakeline.topology import Topology

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def catalog(tmp_path: Path) -> Any:
    return compile_catalog(catalog_dir(tmp_path, {
        "profile": derivation("profile", "read: true\ncooldown_s: 60",
                              source="collections: [main]\n  types: [chat]")}))


@pytest.fixture
def app(catalog: Any) -> Any:
    # No database or broker behind it: every request here is refused before it needs one.
    ctx = ApiContext(Topology(name="unit"), catalog, "postgresql://nobody@127.0.0.1:9/none",
                     "127.0.0.1:9", settings=ApiSettings(tokens={"a": SecretStr("ta"),
                                                                 "b": SecretStr("tb")}))
    return create_app(ctx)


def call(app: Any, method: str, path: str, token: str | None = "ta", **kw: Any
         ) -> httpx.Response:
    async def go() -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://api") as c:
            return await c.request(method, path, headers=headers, **kw)

    return asyncio.run(go())


# -- settings ---------------------------------------------------------------------------


def test_settings_from_yaml_env_and_overrides(tmp_path: Path, monkeypatch: Any) -> None:
    f = tmp_path / "api.yaml"
    f.write_text("tokens: {default: s1, acme: s2}\nreply_timeout_s: 0.5\n")
    s = load_settings(f)
    assert {k: v.get_secret_value() for k, v in s.tokens.items()} == {"default": "s1",
                                                                      "acme": "s2"}
    assert s.reply_timeout_s == 0.5 and "s1" not in repr(s)
    monkeypatch.setenv("WAKELINE_API_OPERATOR_TOKEN", "ops")
    assert load_settings(f).operator_token.get_secret_value() == "ops"  # type: ignore[union-attr]
    monkeypatch.setenv("WAKELINE_API_TOKENS", '{"x": "tx"}')
    assert list(load_settings().tokens) == ["x"]


@pytest.mark.parametrize("text, message", [
    ("tokens: {a: same, b: same}\n", "share one token"),
    ("tokens: {a: ''}\n", "may not be empty"),
    ("reply_timeout_s: 0\n", "reply_timeout_s"),
    ("nonsense: 1\n", "nonsense"),
    ("- a list\n", "must be a mapping"),
])
def test_bad_settings_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "api.yaml"
    f.write_text(text)
    with pytest.raises(ApiConfigInvalid, match=message):
        load_settings(f)


# -- request models -----------------------------------------------------------------------


@pytest.mark.parametrize("body, field", [
    ({"entity": "a\x00b", "collection": "main"}, "entity"),
    ({"entity": "e", "collection": "main", "content": {"k": "\ud800"}}, "content"),
    ({"entity": "e", "collection": "main", "content": {"n": 2**70}}, "content"),
    ({"entity": "e", "collection": "main", "content": {"x": float("nan")}}, "content"),
    ({"entity": "", "collection": "main"}, "entity"),
    ({"entity": "e", "collection": "main", "parents": [0]}, "parents"),
    ({"entity": "e", "collection": "main", "surprise": 1}, "surprise"),
])
def test_record_bodies_refuse_what_postgresql_would(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        RecordIn.model_validate(body)
    assert e.value.errors()[0]["loc"][0] == field


def test_instants_need_a_zone_and_a_sane_range() -> None:
    assert ManualRunIn.model_validate({"entity": "e", "run_after": "2026-07-19T11:00:00+02:00"}
                                      ).run_after.isoformat() == "2026-07-19T09:00:00+00:00"
    for bad in ("2026-07-19T09:00:00", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59-12:00"):
        with pytest.raises(ValidationError):
            ManualRunIn.model_validate({"entity": "e", "run_after": bad})


def test_mark_ready_keys_are_seqs() -> None:
    m = MarkReadyIn.model_validate({"seqs": [3], "scores": {"3": {"importance": 1}}})
    assert m.scores == {3: {"importance": 1}}
    with pytest.raises(ValidationError):
        MarkReadyIn.model_validate({"seqs": []})


# -- auth and errors on the real app --------------------------------------------------------


def test_no_token_unknown_token_and_malformed_header_are_401(app: Any) -> None:
    for token, code in ((None, "auth.missing"), ("nope", "auth.invalid")):
        r = call(app, "GET", "/runs", token=token)
        assert r.status_code == 401 and r.json()["error"]["code"] == code
        assert r.headers["www-authenticate"].startswith("Bearer")
    r = call(app, "GET", "/runs", token=None, headers={"Authorization": "Basic eDp5"})
    assert r.status_code == 401 and r.json()["error"]["field"] == "Authorization"


def test_naming_another_workspace_is_403_with_the_field(app: Any) -> None:
    r = call(app, "POST", "/records", json={"entity": "e", "collection": "main",
                                            "workspace": "b"})
    assert r.status_code == 403
    assert r.json()["error"] == {"code": "auth.workspace_denied", "field": "workspace",
                                 "location": "body", "errors": [],
                                 "message": "this token acts in workspace 'a', not 'b'"}
    r = call(app, "GET", "/runs", params={"workspace": "b"})
    assert r.status_code == 403 and r.json()["error"]["location"] == "query"
    r = call(app, "GET", "/jobs/b/profile/e/1.1", token="ta")
    assert r.status_code == 404 and r.json()["error"]["code"] == "job.not_found"


def test_validation_errors_name_every_failing_field(app: Any) -> None:
    r = call(app, "POST", "/records/batch", json={"records": [
        {"entity": "e", "collection": "main"}, {"collection": 3}]})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "request.invalid" and err["location"] == "body"
    fields = {e["field"] for e in err["errors"]}
    assert {"records.1.entity", "records.1.collection"} <= fields
    r = call(app, "GET", "/runs/0")
    assert r.status_code == 422 and r.json()["error"]["field"] == "run_id"
    r = call(app, "GET", "/nowhere")
    assert r.status_code == 404 and r.json()["error"]["code"] == "route.not_found"
    r = call(app, "DELETE", "/runs")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method.not_allowed"


def test_catalog_checks_answer_422_before_any_write(app: Any) -> None:
    r = call(app, "POST", "/records", json={"entity": "e", "collection": "main",
                                            "type": "chat", "key": "k"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "record.key_forbidden"
    r = call(app, "POST", "/records/retract", json={"entity": "e", "collection": "main",
                                                    "key": "k"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "record.not_keyed"
    r = call(app, "POST", "/processors/ghost/run", json={"entity": "e"})
    assert r.status_code == 404 and r.json()["error"]["field"] == "derivation"


def test_the_openapi_document(app: Any) -> None:
    doc = call(app, "GET", "/openapi.json", token=None).json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    paths = doc["paths"]
    for path in ("/records", "/records/batch", "/records/ready", "/records/retract", "/triggers",
                 "/document", "/runs", "/runs/{run_id}", "/jobs/{job_id}", "/explain",
                 "/processors/{derivation}/run", "/triggers/{name}/pause",
                 "/triggers/{name}/resume", "/metrics", "/dashboard/data"):
        assert path in paths, path
    for path, item in paths.items():
        for op in item.values():
            assert op["responses"]["503"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/Error"}, path
    fresh = doc["components"]["schemas"]["Freshness"]
    assert sorted(fresh["properties"]) == sorted(["derivation", "last_run_at", "watermark",
                                                  "dirty", "pending_unready", "job",
                                                  "error_kind"])
    assert "/dashboard" not in paths


def test_dashboard_page_renders_every_panel_the_data_has(app: Any) -> None:
    r = call(app, "GET", "/dashboard", token=None)
    assert r.status_code == 200 and "__REFRESH_MS__" not in r.text
    ids = set(re.findall(r'id="panel-([a-z_]+)"', r.text))
    renders = set(re.findall(r"^  ([a-z_]+)\(d\) \{", r.text, flags=re.M))
    assert ids == renders == set(api_ops.PANELS)


# -- the agent's reply -------------------------------------------------------------------------


def test_reply_of_a_read_and_a_manual_run(catalog: Any) -> None:
    engine = Engine(build_plan(catalog))
    st = EntityState("a", "user:mia")
    rec = Rec(1, "main", 1, "chat", annotations={"mood_v1": {"valence": 0, "label": "x"}},
              enriched_at=100.0, created_at=100.0)
    st = engine.apply(st, RecordChanged("c", rec, lsn=1), 100.0).state
    raw = b'{"type":"read","max_staleness":900,"request_id":"r1"}'
    assert replies.request_id(raw) == "r1"
    assert replies.request_id(b'{"type":"tick"}') is None
    step = engine.apply(st, Read(900), 200.0)
    kind, reply, job_ids = replies.reply_of(raw, step)
    assert kind == "read"
    assert reply["freshness"] == [{"derivation": "profile", "last_run_at": None, "watermark": 0,
                                   "dirty": True, "pending_unready": False, "job": "enqueued",
                                   "error_kind": None}]
    assert job_ids == [reply["jobs"][0]["job_id"]] and reply["dispatched"] == job_ids
    step2 = engine.apply(step.state, ManualRun("profile"), 201.0)
    kind, reply, _ = replies.reply_of(b'{"type":"manual","request_id":"r2"}', step2)
    assert kind == "manual" and reply["job"]["coalesced"] is False  # the first one is running
    assert reply["job"]["run_after"] == "1970-01-01T00:03:21Z"


# -- small pieces --------------------------------------------------------------------------------


def test_file_clock_is_shared_through_a_file_and_never_goes_back(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    f = tmp_path / "clock"
    FileClock.write(f, "2026-07-19T09:00:00Z")
    monkeypatch.setenv("WAKELINE_CLOCK_FILE", str(f))
    clock = clock_from_env()
    assert isinstance(clock, FileClock)
    other = FileClock(f)
    clock.advance(90)
    assert other.now().isoformat() == "2026-07-19T09:01:30+00:00"
    with pytest.raises(ValueError):
        other.set("2026-07-19T09:00:00Z")


def test_prometheus_label_values_are_escaped() -> None:
    t = _Text()
    t.metric("wakeline_x", "gauge", "help")
    t.metric("wakeline_x", "gauge", "help")
    t.sample("wakeline_x", 1, reason='say "hi"\\\n')
    assert t.lines == ["# HELP wakeline_x help", "# TYPE wakeline_x gauge",
                       'wakeline_x{reason="say \\"hi\\"\\\\\\n"} 1']
