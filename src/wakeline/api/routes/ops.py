"""The operational surface: ``/metrics`` (Prometheus text), ``/dashboard`` and its data,
``/healthz``.  Guarded by the operator token when one is configured."""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, PlainTextResponse

from wakeline.api import ops
from wakeline.api.auth import operator
from wakeline.api.context import ApiContext
from wakeline.clock import iso

router = APIRouter(tags=["operations"])


def _ctx(request: Request) -> ApiContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


@router.get("/healthz", summary="Liveness: the API answers and PostgreSQL is reachable")
def healthz(request: Request) -> dict[str, Any]:
    ctx = _ctx(request)
    with ctx.pool.connection() as conn:
        conn.execute("SELECT 1")
    return {"ok": True, "catalog_hash": ctx.catalog.hash}


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
def dashboard(request: Request) -> HTMLResponse:
    html = resources.files("wakeline.api").joinpath("static/dashboard.html").read_text()
    refresh_ms = int(_ctx(request).settings.dashboard_refresh_s * 1000)
    return HTMLResponse(html.replace("__REFRESH_MS__", str(refresh_ms)))


@router.get("/dashboard/data", dependencies=[Depends(operator)],
            summary="Every dashboard panel; each one succeeds or fails on its own")
def dashboard_data(request: Request) -> dict[str, Any]:
    ctx = _ctx(request)
    return {"at": iso(ctx.clock.now()), "panels": ops.collect(ctx)}


def _esc(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._seen: set[str] = set()

    def metric(self, name: str, kind: str, help_: str) -> None:
        if name not in self._seen:
            self._seen.add(name)
            self.lines.append(f"# HELP {name} {help_}")
            self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float | int, **labels: Any) -> None:
        lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")


def _metrics_from_db(ctx: ApiContext, t: _Text) -> None:
    with ctx.pool.connection() as conn:
        t.metric("wakeline_runs_total", "counter", "Runs by derivation and outcome.")
        for d, o, n in conn.execute("SELECT derivation, outcome, count(*) FROM runs "
                                    "GROUP BY 1, 2 ORDER BY 1, 2").fetchall():
            t.sample("wakeline_runs_total", n, derivation=d, outcome=o)
        t.metric("wakeline_run_duration_seconds", "histogram", "Run durations.")
        bounds = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)
        cols = ", ".join(f"count(*) FILTER (WHERE dur <= {b})" for b in bounds)
        for row in conn.execute(
                f"SELECT derivation, {cols}, count(*), coalesce(sum(dur), 0) FROM "
                "(SELECT derivation, extract(epoch FROM finished_at - started_at) AS dur "
                "FROM runs) r GROUP BY derivation ORDER BY derivation").fetchall():
            d = row[0]
            for b, n in zip(bounds, row[1:1 + len(bounds)], strict=True):
                t.sample("wakeline_run_duration_seconds_bucket", n, derivation=d, le=b)
            t.sample("wakeline_run_duration_seconds_bucket", row[-2], derivation=d, le="+Inf")
            t.sample("wakeline_run_duration_seconds_count", row[-2], derivation=d)
            t.sample("wakeline_run_duration_seconds_sum", float(row[-1]), derivation=d)
        t.metric("wakeline_jobs", "gauge", "Jobs claimed by derive workers, by state.")
        for s, n in conn.execute("SELECT state, count(*) FROM jobs GROUP BY 1 ORDER BY 1"):
            t.sample("wakeline_jobs", n, state=s)
        t.metric("wakeline_outcomes_total", "counter", "Recorded outcomes by kind.")
        for k, n in conn.execute("SELECT kind, count(*) FROM outcomes GROUP BY 1 ORDER BY 1"):
            t.sample("wakeline_outcomes_total", n, kind=k)
        t.metric("wakeline_triggers_paused", "gauge", "Open operator pauses.")
        row = conn.execute("SELECT count(*) FROM trigger_pauses WHERE released_at IS NULL "
                           "AND (until IS NULL OR until > %s)", (ctx.clock.now(),)).fetchone()
        t.sample("wakeline_triggers_paused", row[0] if row else 0)


def _metrics_lag(ctx: ApiContext, t: _Text) -> None:
    lag = ops.consumer_lag(ctx)
    t.metric("wakeline_consumer_lag_reliable", "gauge",
             "1 when the broker's end offsets count records (0 on Tansu).")
    t.sample("wakeline_consumer_lag_reliable", int(lag["reliable"]), broker=lag["broker"])
    t.metric("wakeline_consumer_committed_offset", "counter",
             "Committed offset per group/topic/partition; rate() is the agent's events/s.")
    t.metric("wakeline_consumer_lag", "gauge", "End offset minus committed offset.")
    for r in lag["partitions"]:
        labels = {"group": r["group"], "topic": r["topic"], "partition": r["partition"],
                  "agent": r["agent"]}
        if r["committed"] is not None:
            t.sample("wakeline_consumer_committed_offset", r["committed"], **labels)
        if r["lag"] is not None:
            t.sample("wakeline_consumer_lag", r["lag"], **labels)


def _metrics_slots(ctx: ApiContext, t: _Text) -> None:
    t.metric("wakeline_replication_slot_lag_bytes", "gauge",
             "WAL bytes between the current position and the slot's confirmed flush.")
    for s in ops.replication_slots(ctx)["slots"]:
        t.sample("wakeline_replication_slot_lag_bytes", int(s["lag_bytes"] or 0),
                 slot=s["slot_name"], active=str(bool(s["active"])).lower())


def _metrics_mailbox(ctx: ApiContext, t: _Text) -> None:
    m = ops.mailbox(ctx)
    t.metric("wakeline_mailbox_jobs", "gauge", "Jobs in the conditions agents' mailboxes.")
    t.sample("wakeline_mailbox_jobs", m["queued"], state="queued")
    t.sample("wakeline_mailbox_jobs", m["running"], state="running")
    t.metric("wakeline_mailbox_oldest_queued_age_seconds", "gauge", "Age of the oldest queued job.")
    t.sample("wakeline_mailbox_oldest_queued_age_seconds",
             m["oldest_queued"]["age_s"] if m["oldest_queued"] else 0)


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(operator)],
            summary="Prometheus text format")
def metrics(request: Request) -> PlainTextResponse:
    ctx = _ctx(request)
    t = _Text()
    t.metric("wakeline_api_requests_total", "counter", "API requests by route and status.")
    for (method, route, status), n in sorted(request.app.state.requests.items()):
        t.sample("wakeline_api_requests_total", n, method=method, route=route, status=status)
    failed: dict[str, int] = {}
    for name, fn in (("postgres", _metrics_from_db), ("consumer_lag", _metrics_lag),
                     ("replication_slots", _metrics_slots), ("mailbox", _metrics_mailbox)):
        mark, seen = len(t.lines), set(t._seen)
        try:
            fn(ctx, t)
            failed[name] = 0
        except Exception:  # one collector failing leaves the others' families intact
            del t.lines[mark:]
            t._seen = seen
            failed[name] = 1
    t.metric("wakeline_scrape_error", "gauge", "1 when a collector failed in this scrape.")
    for name, bad in failed.items():
        t.sample("wakeline_scrape_error", bad, collector=name)
    return PlainTextResponse("\n".join(t.lines) + "\n",
                             media_type="text/plain; version=0.0.4; charset=utf-8")
