"""Cron buckets in UTC: which buckets are due, which are caught up, which missed.

A *bucket* is a scheduled instant of a cron expression.  The scheduler keeps the
last completed bucket durably; :func:`due_buckets` says what to fire now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from croniter import croniter

MAX_CRON_CATCHUP = 3


@dataclass(frozen=True)
class CronPlan:
    fire: list[datetime]      # buckets to fire now, oldest first
    missed: list[datetime]    # buckets skipped beyond the catch-up bound
    last_bucket: datetime | None  # the new durable "last completed bucket"


def latest_due(expr: str, now: datetime) -> datetime:
    """The latest bucket at or before ``now``."""
    # get_prev is strict; nudging the start by 1 µs makes a bucket exactly at now due.
    start = now.astimezone(UTC) + timedelta(microseconds=1)
    prev: datetime = croniter(expr, start, ret_type=datetime).get_prev(datetime)
    return prev.astimezone(UTC)


def next_bucket(expr: str, after: datetime) -> datetime:
    nxt: datetime = croniter(expr, after.astimezone(UTC), ret_type=datetime).get_next(datetime)
    return nxt.astimezone(UTC)


def due_buckets(
    expr: str, last_bucket: datetime | None, now: datetime, max_catchup: int = MAX_CRON_CATCHUP
) -> CronPlan:
    """Plan the buckets to fire at ``now`` given the last completed bucket.

    A brand-new schedule (``last_bucket is None``) starts at its latest due bucket
    rather than replaying history: that bucket becomes its last completed one and
    the first fire is the next bucket (deploying a nightly job at 10:00 does not
    run it at once for every entity).  After downtime at most ``max_catchup`` of the
    most recent missed buckets fire; older ones are reported as missed.
    """
    latest = latest_due(expr, now)
    if last_bucket is None:
        return CronPlan([], [], latest)
    if latest <= last_bucket:
        return CronPlan([], [], last_bucket)
    pending: list[datetime] = []
    cursor = last_bucket
    while True:
        cursor = next_bucket(expr, cursor)
        if cursor > now:
            break
        pending.append(cursor)
    fire = pending[-max_catchup:] if max_catchup > 0 else []
    missed = pending[: len(pending) - len(fire)]
    return CronPlan(fire, missed, pending[-1])


def is_valid(expr: str) -> bool:
    return bool(croniter.is_valid(expr))
