-- A cron bucket's dedupe key names the scan, which reaches many entities: it is
-- unique per mailbox, not across the table.
DROP INDEX IF EXISTS jobs_dedupe;
CREATE UNIQUE INDEX IF NOT EXISTS jobs_dedupe_per_mailbox
    ON jobs (dedupe_key, workspace, derivation, entity) WHERE dedupe_key IS NOT NULL;
