"""The job wire format on the derive topic: field names, and a lossless round trip."""

from __future__ import annotations

import json

from wakeline.derive.executor import JobSpec


def test_a_job_round_trips_through_its_wire_form() -> None:
    job = JobSpec("j-1", "default", "summary", "user:mïa 🚀",
                  ("trigger:summary.default:write", "manual"), 1_780_000_000.25, 3, ("k1",))
    wire = job.to_json()
    assert json.loads(wire) == {
        "job_id": "j-1", "workspace": "default", "derivation": "summary",
        "entity": "user:mïa 🚀", "reasons": ["trigger:summary.default:write", "manual"],
        "run_after": 1_780_000_000.25, "attempt": 3, "dedupe": ["k1"]}
    assert JobSpec.from_json(wire) == job
    assert JobSpec.from_json(wire.decode()) == job


def test_older_jobs_without_optional_fields_still_read() -> None:
    job = JobSpec.from_json(b'{"job_id":"j","workspace":"w","derivation":"d","entity":"e"}')
    assert (job.reasons, job.run_after, job.attempt, job.dedupe) == ((), None, 1, ())
