"""The derive role: jobs from the derive topic, run in batches.

:func:`consume` takes what arrived on the topic within ``WAKELINE_DERIVE_BATCH_WAIT``
seconds (5 ms), up to ``WAKELINE_DERIVE_BATCH`` jobs (64), through the offset guard
(streams/guard.py), and hands them to :func:`run_jobs`, which runs them with
:meth:`DeriveExecutor.execute_batch` (one claim round trip and one commit
transaction for the batch, each job guarded on its own).

Up to ``WAKELINE_DERIVE_PIPELINE`` batches (2) are in flight: while one runs on an
executor thread, Faust delivers the next.  Faust delivers nothing to a
``take_events`` loop while its body runs, so awaiting each batch there serialized
Faust's per-event delivery (~150 us a job) with PostgreSQL's round trips, and a
derive worker process ran 2.0-2.2k noop jobs/s (bench/derive_worker.py).  Each
message of a batch holds one more reference until its job ended (succeeded, noop,
dead, or answered duplicate), so Faust, which commits a partition only up to its
first unacknowledged offset, never commits past a job that has not ended.  A batch
sharing a mailbox with one in flight waits for it: jobs of one mailbox never run
side by side.

A job that failed and may be retried (``retry_in``) runs again after its backoff
with the next attempt; the batch's other jobs are reported when they end, not
held back by it.  A failure of the database or of the worker (not of the
derivation) is retried with a growing delay and never dropped: a whole batch
that failed reconnects the executor first, a job whose own write failed is
retried alone.  Jobs of one mailbox in a batch (a redelivery) run one after the
other, each with its retries, in their order.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from wakeline.derive import JobSpec, RunResult
from wakeline.derive.executor import waves

log = logging.getLogger("wakeline.streams.derive")


def batch_max() -> int:
    """Most jobs the agent runs as one batch."""
    return max(1, int(os.environ.get("WAKELINE_DERIVE_BATCH", "64")))


def batch_wait() -> float:
    """Longest a job waits for its batch to fill (seconds)."""
    return float(os.environ.get("WAKELINE_DERIVE_BATCH_WAIT", "0.005"))


def infra_delay(failures: int) -> float:
    """Delay before retrying after the ``failures``-th infrastructure failure."""
    return min(30.0, 0.5 * 2 ** failures)


def _no_trace(*parts: Any) -> None:
    return None


def pipeline_depth() -> int:
    """Most batches in flight at once."""
    return max(1, int(os.environ.get("WAKELINE_DERIVE_PIPELINE", "2")))


async def consume(app: Any, rt: Any, stream: Any, guard: Any,
                  trace: Callable[..., None] = _no_trace) -> None:
    """The derive agent's loop over its stream (see the module docstring)."""
    from wakeline.streams.guard import admit_batch

    inflight: collections.deque[tuple[asyncio.Future[None], set[Any]]] = collections.deque()
    depth = pipeline_depth()
    try:
        async for events in stream.take_events(batch_max(), within=batch_wait()):
            batch = await admit_batch(app, guard, events)
            while inflight and inflight[0][0].done():
                await inflight.popleft()[0]  # a failure is raised here
            if not batch:
                continue
            jobs = []
            for ev in batch:
                job = JobSpec.from_json(ev.value)
                trace("derive-recv", job.job_id, ev.message.partition, ev.message.offset)
                jobs.append(job)
            boxes = {job.mailbox for job in jobs}
            while inflight and (len(inflight) >= depth
                                or any(boxes & b for _, b in inflight)):
                await inflight.popleft()[0]
            for ev in batch:  # released when the job ended (_run_and_ack)
                ev.message.incref()
            inflight.append((asyncio.ensure_future(_run_and_ack(rt, stream, batch, jobs, trace)),
                             boxes))
        while inflight:
            await inflight.popleft()[0]
    finally:
        for task, _ in inflight:
            task.cancel()


async def _run_and_ack(rt: Any, stream: Any, events: list[Any], jobs: list[JobSpec],
                       trace: Callable[..., None]) -> None:
    await run_jobs(rt, jobs, trace)
    for ev in events:
        await stream.ack(ev)


async def run_jobs(rt: Any, jobs: list[JobSpec], trace: Callable[..., None] = _no_trace
                   ) -> None:
    """Run ``jobs`` to their end: each is reported once (``rt.on_run``) per attempt
    that ran, retried while it may be, and none is dropped."""
    ex = await rt.executor()
    try:
        for wave in waves(jobs):
            await _run_wave(rt, ex, [jobs[i] for i in wave], trace)
    finally:
        rt._executors.put_nowait(ex)


async def _run_wave(rt: Any, ex: Any, jobs: list[JobSpec], trace: Callable[..., None]
                    ) -> None:
    loop = asyncio.get_running_loop()
    # (when it is due, its place in the batch, the job); infra failures per job id
    pending: list[tuple[float, int, JobSpec]] = [(0.0, k, job) for k, job in enumerate(jobs)]
    infra: dict[str, int] = {}
    while pending:
        now = loop.time()
        due = [p for p in pending if p[0] <= now]
        if not due:
            await asyncio.sleep(min(p[0] for p in pending) - now)
            continue
        pending = [p for p in pending if p[0] > now]
        due.sort(key=lambda p: p[1])
        batch = [job for _, _, job in due]
        try:
            answers = await loop.run_in_executor(rt._pool, ex.execute_batch, batch)
        except Exception:
            # The database or the worker failed, not a derivation: the batch is
            # retried (never dropped) on a new connection; no cursor row was touched
            # by a job that did not commit.
            log.exception("a batch of %d jobs failed in the worker", len(batch))
            with contextlib.suppress(Exception):
                ex.reset()
            for _, k, job in due:
                infra[job.job_id] = n = infra.get(job.job_id, 0) + 1
                pending.append((loop.time() + infra_delay(n), k, job))
            continue
        for (_, k, job), answer in zip(due, answers, strict=True):
            if isinstance(answer, Exception):
                # This job's own write failed (and applied nothing); the others
                # committed.  Retried alone, with the same attempt.
                infra[job.job_id] = n = infra.get(job.job_id, 0) + 1
                log.error("job %s attempt %d failed in the worker: %r", job.job_id,
                          job.attempt, answer)
                pending.append((loop.time() + infra_delay(n), k, job))
                continue
            _report(rt, answer, trace)
            if answer.outcome == "failed" and answer.retry_in is not None:
                pending.append((loop.time() + answer.retry_in, k,
                                replace(job, attempt=job.attempt + 1)))


def _report(rt: Any, result: RunResult, trace: Callable[..., None]) -> None:
    rt.counters.runs += 1
    trace("result", result.job_id, result.outcome)
    if rt.on_run is not None:
        rt.on_run(result)
