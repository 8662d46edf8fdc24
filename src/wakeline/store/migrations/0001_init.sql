-- Wakeline schema, version 1.  PostgreSQL is the truth: every table the stream
-- derives state from lives here.  Statements are idempotent (IF NOT EXISTS) so a
-- half-applied migration can be re-run.

CREATE TABLE IF NOT EXISTS records (
    seq                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace          text        NOT NULL,
    entity             text        NOT NULL,
    collection         text        NOT NULL,
    collection_version integer     NOT NULL DEFAULT 1,
    type               text        NOT NULL DEFAULT '',
    status             text        NOT NULL DEFAULT 'active',
    key                text,
    content            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    text               text        NOT NULL DEFAULT '',
    tombstone          boolean     NOT NULL DEFAULT false,
    parents            bigint[]    NOT NULL DEFAULT '{}',
    annotations        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    scores             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    enriched_at        timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    produced_by_run    bigint,
    CONSTRAINT records_tombstone_shape CHECK (
        NOT tombstone OR (key IS NOT NULL AND text = '' AND cardinality(parents) >= 1)
    ),
    CONSTRAINT records_tombstone_ready CHECK (NOT tombstone OR enriched_at IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS records_entity_seq ON records (workspace, entity, seq);
CREATE INDEX IF NOT EXISTS records_keyed_head
    ON records (workspace, entity, collection, key, seq DESC) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS records_unready
    ON records (workspace, entity, seq) WHERE enriched_at IS NULL;

-- One bookmark per (workspace, derivation, entity): how far the derivation read.
CREATE TABLE IF NOT EXISTS derivation_cursors (
    workspace           text        NOT NULL,
    derivation          text        NOT NULL,
    entity              text        NOT NULL,
    watermark           bigint      NOT NULL DEFAULT 0,
    last_run_at         timestamptz,
    last_success_at     timestamptz,
    last_run_id         bigint,
    -- every `at` deadline at or before this instant is handled (the completion
    -- time of the latest successful run).
    at_handled_through  timestamptz,
    advance_count       bigint      NOT NULL DEFAULT 0,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace, derivation, entity)
);

CREATE TABLE IF NOT EXISTS jobs (
    job_id       text        PRIMARY KEY,
    workspace    text        NOT NULL,
    derivation   text        NOT NULL,
    entity       text        NOT NULL,
    state        text        NOT NULL CHECK (state IN
                   ('queued', 'running', 'retrying', 'succeeded', 'noop', 'failed', 'dead')),
    reasons      text[]      NOT NULL DEFAULT '{}',
    run_after    timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    dedupe_key   text,
    last_error   text,
    error_kind   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
-- Invariant 4: at most one queued and at most one running job per mailbox.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_one_queued
    ON jobs (workspace, derivation, entity) WHERE state IN ('queued', 'retrying');
CREATE UNIQUE INDEX IF NOT EXISTS jobs_one_running
    ON jobs (workspace, derivation, entity) WHERE state = 'running';
CREATE UNIQUE INDEX IF NOT EXISTS jobs_dedupe ON jobs (dedupe_key) WHERE dedupe_key IS NOT NULL;

CREATE TABLE IF NOT EXISTS runs (
    run_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id            text        NOT NULL,
    attempt           integer     NOT NULL DEFAULT 1,
    workspace         text        NOT NULL,
    derivation        text        NOT NULL,
    entity            text        NOT NULL,
    trigger_reasons   text[]      NOT NULL DEFAULT '{}',
    definition_hashes jsonb       NOT NULL DEFAULT '{}'::jsonb,
    outcome           text        NOT NULL CHECK (outcome IN
                        ('succeeded', 'noop', 'failed', 'timeout', 'dead')),
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz NOT NULL,
    watermark_before  bigint      NOT NULL DEFAULT 0,
    watermark_after   bigint      NOT NULL DEFAULT 0,
    records_consumed  integer     NOT NULL DEFAULT 0,
    error             text,
    error_kind        text,
    -- Invariant 7: a redelivered job attempt cannot apply twice.
    CONSTRAINT runs_job_attempt UNIQUE (job_id, attempt)
);
CREATE INDEX IF NOT EXISTS runs_by_entity ON runs (workspace, derivation, entity, run_id DESC);

-- Invariant 8: every non-fire is a typed, recorded outcome.
CREATE TABLE IF NOT EXISTS outcomes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace   text        NOT NULL,
    derivation  text,
    trigger     text,
    entity      text,
    kind        text        NOT NULL,
    reason      text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS outcomes_by_entity ON outcomes (workspace, derivation, entity, id DESC);
CREATE INDEX IF NOT EXISTS outcomes_by_kind ON outcomes (kind, id DESC);

-- Seed 004: change-feed handlers own one durable cursor each.
CREATE TABLE IF NOT EXISTS feed_cursors (
    name           text        PRIMARY KEY,
    position       text        NOT NULL DEFAULT '',
    state          text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'paused')),
    failure_count  integer     NOT NULL DEFAULT 0,
    last_error     text,
    paused_reason  text CHECK (paused_reason IS NULL OR paused_reason IN ('max-failures', 'circuit-breaker', 'operator')),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Cron: the last completed bucket per (workspace, trigger), durable across restarts.
CREATE TABLE IF NOT EXISTS cron_buckets (
    workspace    text        NOT NULL,
    trigger      text        NOT NULL,
    last_bucket  timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace, trigger)
);

-- Operator pauses of triggers (resume / pause with an optional until).
CREATE TABLE IF NOT EXISTS trigger_pauses (
    workspace   text        NOT NULL,
    trigger     text        NOT NULL,
    reason      text        NOT NULL,
    until       timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace, trigger)
);
