-- How the last run of a mailbox ended, on the cursor row itself: the stream
-- learns from this row's change (on the CDC topic, in order with the entity's
-- records) that the running job finished, successfully or dead.
ALTER TABLE derivation_cursors ADD COLUMN IF NOT EXISTS last_outcome text;
ALTER TABLE derivation_cursors ADD COLUMN IF NOT EXISTS last_job_id text;
