-- Lease history and ledger write times, so that a recorded run can be checked from the database
-- alone.
--
-- The leases table holds only each lease's current epoch. An external checker needs every epoch
-- a lease ever had and when it began, to tell whether a ledger row was written by an owner whose
-- tenure had already been superseded. lease_history is that record: one append-only row per
-- epoch, written by a trigger whatever statement changed the epoch.
CREATE TABLE lease_history (
    history_id  bigserial PRIMARY KEY,
    name        text NOT NULL,
    partition   integer,
    epoch       bigint NOT NULL,
    holder_id   text,
    -- clock_timestamp(), not now(): the moment the row lock was held and the epoch changed,
    -- not the start of the acquiring transaction.
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX lease_history_name_epoch ON lease_history (name, epoch);

CREATE FUNCTION lease_history_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.epoch IS DISTINCT FROM OLD.epoch THEN
        INSERT INTO lease_history (name, partition, epoch, holder_id, acquired_at)
        VALUES (NEW.name, NEW.partition, NEW.epoch, NEW.holder_id, clock_timestamp());
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER lease_history_record AFTER INSERT OR UPDATE OF epoch ON leases
    FOR EACH ROW EXECUTE FUNCTION lease_history_record();

-- The history is append-only, like the ledger.
CREATE TRIGGER lease_history_append_only BEFORE UPDATE OR DELETE ON lease_history
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER lease_history_no_truncate BEFORE TRUNCATE ON lease_history
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- Leases that existed before this migration get their current epoch recorded once.
INSERT INTO lease_history (name, partition, epoch, holder_id, acquired_at)
SELECT name, partition, epoch, holder_id, coalesce(acquired_at, now()) FROM leases;

-- When each ledger row was written. A fenced batch holds its lease row FOR KEY SHARE until it
-- commits and an acquisition locks that row FOR UPDATE before it bumps the epoch, so every write
-- under epoch e precedes, on the database clock, the acquisition of any later epoch. A row whose
-- written_at is after the acquired_at of a higher epoch of its partition's lease was therefore
-- accepted from a superseded owner. recorded_at (now()) is the transaction start and cannot show
-- that; clock_timestamp() at insert can. apply_fenced_batch never sets this column.
ALTER TABLE ledger ADD COLUMN written_at timestamptz NOT NULL DEFAULT clock_timestamp();
