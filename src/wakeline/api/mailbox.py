"""The API's side of the request/reply with the conditions agent.

``ask`` sends a stimulus carrying a fresh ``request_id`` to the stimuli topic,
keyed by the entity (so it reaches the entity's mailbox in order with everything
else about it), waits until the broker acknowledged it, then polls
``stimulus_replies`` for the agent's answer for at most ``timeout`` seconds.
The answer says what the mailbox did (job id, coalesced, run_after; or a read's
freshness) — it is written before the job runs, so nothing here ever waits for
a run.  No answer in time returns None: the stimulus is durable in the log and
the agent applies it when it gets there; ``GET /requests/{id}`` shows the answer.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from wakeline.api.context import ApiContext
from wakeline.api.errors import Unavailable
from wakeline.streams import stimuli
from wakeline.streams.keys import entity_key


def send(ctx: ApiContext, workspace: str, entity: str, kind: str, **fields: Any) -> str:
    rid = uuid.uuid4().hex
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    ctx.producer.produce(ctx.topology.topics.stimuli.name, key=entity_key(workspace, entity),
                         value=stimuli.encode(kind, request_id=rid, **fields),
                         on_delivery=delivered)
    if ctx.producer.flush(10) != 0 or errors:
        raise Unavailable("the broker did not acknowledge the request: "
                          + ("; ".join(errors) or "timeout"), code="broker.unavailable")
    return rid


def wait(ctx: ApiContext, rid: str, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        with ctx.pool.connection() as conn:
            row = conn.execute("SELECT reply FROM stimulus_replies WHERE request_id = %s",
                               (rid,)).fetchone()
        if row is not None:
            return dict(row[0])
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)


def ask(ctx: ApiContext, workspace: str, entity: str, kind: str, timeout: float,
        **fields: Any) -> tuple[str, dict[str, Any] | None]:
    rid = send(ctx, workspace, entity, kind, **fields)
    return rid, wait(ctx, rid, timeout)
