-- Wakeline schema, version 2: change data capture.
--
-- The engine's change topic is logical decoding (pgoutput) of the two tables the
-- stream derives state from.  Both the built-in relay and Debezium read the same
-- publication, each through its own replication slot.
--
-- REPLICA IDENTITY FULL: an UPDATE or DELETE logs the whole old row, so every
-- change event carries `before` (a readiness transition is visible as
-- unready -> ready, a delete says what it removed).
--
-- Idempotent: ALTER ... REPLICA IDENTITY is a no-op when already FULL, and the
-- publication is created only when missing, then (re)pointed at exactly these
-- two tables so a hand-made publication of the same name cannot widen the topic.

ALTER TABLE records REPLICA IDENTITY FULL;
ALTER TABLE derivation_cursors REPLICA IDENTITY FULL;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'wakeline') THEN
        CREATE PUBLICATION wakeline FOR TABLE records, derivation_cursors
            WITH (publish = 'insert, update, delete, truncate');
    ELSE
        ALTER PUBLICATION wakeline SET TABLE records, derivation_cursors;
        ALTER PUBLICATION wakeline SET (publish = 'insert, update, delete, truncate');
    END IF;
END
$$;
