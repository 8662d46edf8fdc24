-- Wakeline schema, version 5: the HTTP API's request/reply with the conditions agent.
--
-- A manual run or a read sent by the API carries a request id on the stimuli topic;
-- the conditions agent answers it here once the entity's mailbox has applied it
-- (job id, coalesced, effective run_after; or the read's freshness entries).  The
-- API waits briefly for the row and never for the run.  `at` is the database's own
-- time: it only serves retention, never a trigger's semantics.
CREATE TABLE IF NOT EXISTS stimulus_replies (
    request_id  text        PRIMARY KEY,
    workspace   text        NOT NULL,
    entity      text        NOT NULL,
    kind        text        NOT NULL,
    reply       jsonb       NOT NULL,
    job_ids     text[]      NOT NULL DEFAULT '{}',
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS stimulus_replies_at ON stimulus_replies (at);
CREATE INDEX IF NOT EXISTS stimulus_replies_jobs ON stimulus_replies USING gin (job_ids);

-- Operator pauses: who paused (the API's workspace principal or the CLI), and the
-- instant the agent released the pause (resume or `until` passed) after sending a
-- re-evaluation to every entity the pause held back.
ALTER TABLE trigger_pauses ADD COLUMN IF NOT EXISTS paused_by text NOT NULL DEFAULT 'operator';
ALTER TABLE trigger_pauses ADD COLUMN IF NOT EXISTS released_at timestamptz;
CREATE INDEX IF NOT EXISTS runs_finished ON runs (finished_at);
CREATE INDEX IF NOT EXISTS outcomes_at ON outcomes (at);
