-- The change-event relay's state (DESIGN.md §14): positions for settled windows, and how far each
-- stream has been published to Redis.
--
-- Streams: one per partition ('partition/17', its ledger rows by position) and 'settlement' (the
-- settled windows by position). The relay runs under the singleton job lease 'job/settlement';
-- its progress rows carry that lease's term and are fenced by the same trigger as the settlement
-- tables (V4), so a relay that slept through its lease cannot move a stream's progress.

-- A settled window's position in the 'settlement' stream: 1, 2, 3, ... in the order windows are
-- settled. The job settles one window per statement, one at a time; the unique index makes any
-- concurrent second settle fail instead of sharing or skipping a position.
ALTER TABLE settlement_runs ADD COLUMN position bigint;

ALTER TABLE settlement_runs DISABLE TRIGGER settlement_runs_final;
ALTER TABLE settlement_runs DISABLE TRIGGER settlement_runs_term_fence;
UPDATE settlement_runs AS r
   SET position = n.position
  FROM (SELECT window_start, row_number() OVER (ORDER BY window_start) AS position
          FROM settlement_runs WHERE status = 'settled') AS n
 WHERE r.window_start = n.window_start;
ALTER TABLE settlement_runs ENABLE TRIGGER settlement_runs_final;
ALTER TABLE settlement_runs ENABLE TRIGGER settlement_runs_term_fence;

ALTER TABLE settlement_runs ADD CONSTRAINT settlement_runs_position
    CHECK ((status = 'settled') = (position IS NOT NULL) AND (position IS NULL OR position >= 1));
CREATE UNIQUE INDEX settlement_runs_by_position ON settlement_runs (position);

CREATE FUNCTION settlement_run_number() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.position := coalesce((SELECT max(position) FROM settlement_runs), 0) + 1;
    RETURN NEW;
END $$;
CREATE TRIGGER settlement_runs_number BEFORE UPDATE ON settlement_runs
    FOR EACH ROW WHEN (NEW.status = 'settled' AND OLD.status <> 'settled')
    EXECUTE FUNCTION settlement_run_number();

-- How far each stream is published: every position up to `published` was acknowledged by Redis
-- (at least once; a relay that dies between Redis's answer and this row's update publishes the
-- tail again under the same ids, which Redis refuses as duplicates).
CREATE TABLE event_relay_progress (
    stream     text PRIMARY KEY CHECK (stream = 'settlement' OR stream ~ '^partition/[0-9]+$'),
    published  bigint NOT NULL DEFAULT 0 CHECK (published >= 0),
    term       bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO event_relay_progress (stream)
SELECT 'partition/' || partition FROM leases WHERE partition IS NOT NULL
UNION ALL SELECT 'settlement'
ON CONFLICT (stream) DO NOTHING;

-- Progress only moves forward: a stream is never "unpublished" in the database, even when Redis
-- lost it (the relay then republishes from its own cursor, DESIGN.md §14).
CREATE FUNCTION event_relay_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.published < OLD.published THEN
        RAISE EXCEPTION 'relay progress of % may not go back (% -> %)',
            OLD.stream, OLD.published, NEW.published USING ERRCODE = 'FA012';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END $$;
CREATE TRIGGER event_relay_forward BEFORE UPDATE ON event_relay_progress
    FOR EACH ROW EXECUTE FUNCTION event_relay_forward();
CREATE TRIGGER event_relay_term_fence BEFORE UPDATE ON event_relay_progress
    FOR EACH ROW EXECUTE FUNCTION settlement_term_fence();
