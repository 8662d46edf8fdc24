"""Stimulus messages on the stimuli topic, and their core events.

JSON objects with a ``type``: ``manual`` (derivation, run_after), ``read``
(max_staleness), ``tick``, ``cron`` (trigger, bucket, catchup), ``reevaluate``
(derivation).  Instants are epoch seconds.
"""

from __future__ import annotations

import json
from typing import Any

from wakeline.core.events import CronFire, Event, ManualRun, Read, Reevaluate, Tick
from wakeline.errors import WakelineError


class BadStimulus(WakelineError):
    code = "stimulus.invalid"


class Resync:
    """Re-read the entity's cursor rows from PostgreSQL (after a partition moved):
    a run whose end the previous owner applied but did not checkpoint is applied
    again, so no mailbox waits forever on a job that already finished."""


def encode(kind: str, **fields: Any) -> bytes:
    return json.dumps({"type": kind, **fields}, separators=(",", ":")).encode()


def decode(raw: bytes) -> Event | Resync:
    try:
        d = json.loads(raw)
        kind = d["type"]
        if kind == "manual":
            return ManualRun(d["derivation"], d.get("run_after"))
        if kind == "read":
            return Read(d.get("max_staleness"))
        if kind == "tick":
            return Tick()
        if kind == "cron":
            return CronFire(d["trigger"], float(d["bucket"]), tuple(d.get("catchup", ())))
        if kind == "reevaluate":
            return Reevaluate(d.get("derivation"))
        if kind == "resync":
            return Resync()
    except (ValueError, KeyError, TypeError) as exc:
        raise BadStimulus(f"malformed stimulus: {exc}") from exc
    raise BadStimulus(f"unknown stimulus type {kind!r}")
