"""Operational read-outs shared by ``/metrics`` and the dashboard.

Each collector answers one panel and may fail on its own (a broker that is down
does not hide PostgreSQL's figures).  Consumer lag is the committed offset of
each group's partitions against the partition's end offset.  Tansu reports end
offsets as the last *batch's* base offset + 1, so on Tansu lag is not computed:
the panel says it is unreliable instead of showing a wrong number.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg.rows import dict_row

from wakeline.api.context import ApiContext
from wakeline.api.rows import ts
from wakeline.clock import iso
from wakeline.core.engine import Engine

TANSU_NOTE = ("Tansu reports a partition's end offset as its last record batch's base "
              "offset + 1 (it counts batches, not records), so consumer lag computed from "
              "it would be wrong: lag is unreliable on this broker and is not shown. "
              "Committed offsets are shown as the broker reports them.")


class Kafka:
    """Cached admin and offset clients of one context (one lock: calls are serial)."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.lock = threading.Lock()
        conf: dict[str, str | int | float | bool] = {
            "bootstrap.servers": ctx.bootstrap, "log_level": 3, "socket.timeout.ms": 5000}
        self.admin = AdminClient(conf)
        self.consumer = Consumer({**conf, "group.id": "wakeline-api-offsets",
                                  "enable.auto.commit": False})
        self._kind: str | None = None

    def broker_kind(self) -> str:
        configured = self.ctx.settings.broker_kind
        if configured != "auto":
            return configured
        if self.ctx.topology.broker.kind == "tansu":
            return "tansu"
        if self._kind is None:
            cluster = self.admin.describe_cluster(request_timeout=5).result(6)
            self._kind = "tansu" if str(cluster.cluster_id or "").startswith("tansu") \
                else "kafka"
        return self._kind

    def groups(self) -> tuple[list[str], str | None]:
        app_id = self.ctx.app_id or ""
        wanted = {app_id, f"{app_id}-readiness" if app_id else "",
                  f"{app_id}-derive" if app_id else "",
                  *self.ctx.settings.consumer_groups} - {""}
        note = None
        try:
            listed = self.admin.list_consumer_groups(request_timeout=5).result(6)
            wanted |= {g.group_id for g in listed.valid}
        except Exception as exc:  # Tansu does not list groups: the configured ones remain
            note = f"the broker did not list consumer groups ({exc})"
        return sorted(g for g in wanted if not g.startswith("wakeline-api-")), note

    def committed(self, group: str) -> list[TopicPartition]:
        fut = self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                     request_timeout=5)
        res = fut[group].result(6)
        return [tp for tp in res.topic_partitions or [] if tp.error is None]


def _kafka(ctx: ApiContext) -> Kafka:
    k = getattr(ctx, "_kafka", None)
    if k is None:
        k = ctx._kafka = Kafka(ctx)  # type: ignore[attr-defined]
    return k


def _agent_of(ctx: ApiContext, topic: str) -> str:
    t = ctx.topology.topics
    return {t.changes.name: "readiness", t.ready.name: "conditions",
            t.stimuli.name: "conditions", t.derive.name: "derive",
            f"{t.changes.name}.cron": "cron"}.get(topic, "other")


def consumer_lag(ctx: ApiContext) -> dict[str, Any]:
    k = _kafka(ctx)
    with k.lock:
        kind = k.broker_kind()
        reliable = kind != "tansu"
        groups, note = k.groups()
        rows: list[dict[str, Any]] = []
        errors: list[str] = []
        for g in groups:
            try:
                tps = k.committed(g)
            except Exception as exc:
                errors.append(f"{g}: {exc}")
                continue
            for tp in sorted(tps, key=lambda x: (x.topic, x.partition)):
                low, high = k.consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=5, cached=False)
                committed = tp.offset if tp.offset >= 0 else None
                lag = None
                if reliable:
                    lag = max(0, high - (committed if committed is not None else low))
                rows.append({"group": g, "topic": tp.topic, "partition": tp.partition,
                             "agent": _agent_of(ctx, tp.topic), "committed": committed,
                             "end": high if reliable else None,
                             "reported_end": high, "lag": lag})
    total = sum(r["lag"] for r in rows) if reliable else None
    by_group: dict[str, int | None] = {}
    for r in rows:
        by_group[r["group"]] = (by_group.get(r["group"]) or 0) + r["lag"] if reliable else None
    return {"broker": kind, "reliable": reliable, "note": None if reliable else TANSU_NOTE,
            "groups": groups, "partitions": rows, "total": total, "by_group": by_group,
            "errors": errors, "listing_note": note}


def replication_slots(ctx: ApiContext) -> dict[str, Any]:
    with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT slot_name, plugin, slot_type, active, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS lag_bytes, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained_bytes "
            "FROM pg_replication_slots WHERE database = current_database() "
            "ORDER BY slot_name").fetchall()
    return {"slots": rows, "total_lag_bytes": sum(int(r["lag_bytes"] or 0) for r in rows)}


def mailbox(ctx: ApiContext) -> dict[str, Any]:
    view = ctx.view
    now = ctx.clock.now().timestamp()
    engine = Engine(ctx.plan)
    queued = running = entities = 0
    oldest_q: dict[str, Any] | None = None
    settle: dict[str, Any] | None = None
    due: dict[str, Any] | None = None
    for st in view.states():
        entities += 1
        for name, ds in st.ds.items():
            if ds.running is not None:
                running += 1
            q = ds.queued
            if q is None:
                continue
            queued += 1
            if oldest_q is None or q.created < oldest_q["_t"]:
                oldest_q = {"_t": q.created, "job_id": q.id, "derivation": name,
                            "entity": st.entity, "workspace": st.workspace,
                            "created_at": ts(q.created), "age_s": round(now - q.created, 3),
                            "run_after": ts(q.run_after)}
            for r in q.settle:
                t = q.reasons.get(r)
                if t is not None and (settle is None or t < settle["_t"]):
                    settle = {"_t": t, "job_id": q.id, "derivation": name, "entity": st.entity,
                              "workspace": st.workspace, "reason": r, "deadline": ts(t),
                              "in_s": round(t - now, 3),
                              "pending_since": ts(q.created)}
        if st.entity:
            w = engine.next_wakeup(st) if any(n in ctx.plan.derivations for n in st.ds) else None
            if w is not None and (due is None or w < due["_t"]):
                due = {"_t": w, "entity": st.entity, "workspace": st.workspace, "at": ts(w),
                       "in_s": round(w - now, 3)}
    if entities == 0 and view.error:
        raise RuntimeError(view.error)
    for d in (oldest_q, settle, due):
        if d is not None:
            d.pop("_t")
    with ctx.pool.connection() as conn:
        row = conn.execute("SELECT count(*) FILTER (WHERE state = 'running'), "
                           "count(*) FILTER (WHERE state = 'retrying'), "
                           "min(updated_at) FILTER (WHERE state = 'retrying') FROM jobs").fetchone()
    assert row is not None
    return {"entities": entities, "queued": queued, "running": running,
            "oldest_queued": oldest_q, "oldest_settle_deadline": settle, "next_due_timer": due,
            "claimed_running": row[0], "retrying": row[1],
            "oldest_retry_since": iso(row[2]), "changelog": view.topic,
            "changelog_messages": view.messages, "view_error": view.error}


def runs(ctx: ApiContext) -> dict[str, Any]:
    now = ctx.clock.now()
    with ctx.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE finished_at > %s), "
            "count(*) FILTER (WHERE finished_at > %s), count(*) FROM runs",
            (now - timedelta(seconds=60), now - timedelta(seconds=300))).fetchone()
        by_outcome = conn.execute(
            "SELECT outcome, count(*) FROM runs WHERE finished_at > %s GROUP BY outcome "
            "ORDER BY outcome", (now - timedelta(hours=1),)).fetchall()
    assert row is not None
    return {"runs_per_s_1m": round(row[0] / 60, 3), "runs_per_s_5m": round(row[1] / 300, 3),
            "last_1m": row[0], "total": row[2],
            "by_outcome_1h": {o: n for o, n in by_outcome}}


def outcomes(ctx: ApiContext) -> dict[str, Any]:
    now = ctx.clock.now()
    since = now - timedelta(hours=1)
    with ctx.pool.connection() as conn:
        kinds = conn.execute("SELECT kind, count(*) FROM outcomes WHERE at > %s GROUP BY kind "
                             "ORDER BY count(*) DESC, kind", (since,)).fetchall()
        reasons = conn.execute(
            "SELECT kind, reason, count(*) FROM outcomes WHERE at > %s GROUP BY kind, reason "
            "ORDER BY count(*) DESC, kind, reason LIMIT 15", (since,)).fetchall()
    return {"since": iso(since), "by_kind": [{"kind": k, "count": n} for k, n in kinds],
            "top_reasons": [{"kind": k, "reason": r, "count": n} for k, r, n in reasons]}


def triggers(ctx: ApiContext) -> dict[str, Any]:
    now = ctx.clock.now()
    with ctx.pool.connection() as conn:
        paused = conn.execute(
            "SELECT workspace, trigger, reason, until, created_at, paused_by FROM trigger_pauses "
            "WHERE released_at IS NULL AND (until IS NULL OR until > %s) "
            "ORDER BY workspace, trigger", (now,)).fetchall()
        dead = conn.execute(
            "SELECT workspace, derivation, count(*) FROM derivation_cursors "
            "WHERE last_outcome = 'dead' GROUP BY workspace, derivation "
            "ORDER BY workspace, derivation").fetchall()
    return {"paused": [{"workspace": w, "trigger": t, "reason": r, "until": iso(u),
                        "since": iso(c), "by": b} for w, t, r, u, c, b in paused],
            "broken": [{"workspace": w, "derivation": d, "dead_entities": n,
                        "reason": f"{n} entit{'y' if n == 1 else 'ies'} whose last run is dead"}
                       for w, d, n in dead]}


PANELS = {"consumer_lag": consumer_lag, "replication_slots": replication_slots,
          "mailbox": mailbox, "runs": runs, "outcomes": outcomes, "triggers": triggers}


def collect(ctx: ApiContext, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Every panel, each ``{"ok", "data"|"error", "took_s"}``: one failure stays local."""
    out: dict[str, dict[str, Any]] = {}
    for name in names or list(PANELS):
        t0 = time.monotonic()
        try:
            out[name] = {"ok": True, "data": PANELS[name](ctx)}
        except Exception as exc:
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out[name]["took_s"] = round(time.monotonic() - t0, 3)
    return out
