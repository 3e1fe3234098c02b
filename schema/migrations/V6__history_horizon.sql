-- Where the lease history and the ledger's write times begin to be true.
--
-- V5 added `lease_history` and `ledger.written_at`, but a database that already held data when
-- V5 ran got neither for its past: every older ledger row was stamped with the moment of the
-- migration, and only each lease's then-current epoch was recorded. Judged by those values, an
-- old row written under an epoch that was superseded long before the migration looks as if it
-- had been written after its successor's acquisition.
--
-- This table records the horizon once, when this migration runs: ledger rows with an entry_id
-- below first_entry_id were written before it, and a checker of write order (the chaos checker's
-- stale-epoch rule) leaves them out. Rows from the horizon on carry a real written_at, and every
-- epoch acquired from then on is in lease_history, so the rule stays sound for them: the first
-- recorded epoch above a row's epoch began no earlier than any epoch between them.
--
-- On a new cluster (every migration applied to an empty database) the horizon is entry 1 and
-- nothing is left out. A database that ran V5 before this migration leaves out the rows written
-- between the two as well: fewer rows checked, never a false report.
CREATE TABLE history_horizon (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    first_entry_id bigint NOT NULL CHECK (first_entry_id >= 1),
    recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The ledger's own lock (as V5's ALTER took), so that no row committed concurrently can get an
-- entry_id below the horizon after it was read.
LOCK TABLE ledger IN SHARE MODE;
INSERT INTO history_horizon (first_entry_id)
SELECT coalesce(max(entry_id), 0) + 1 FROM ledger;

-- Recorded once; like the history it qualifies, never rewritten.
CREATE TRIGGER history_horizon_append_only BEFORE UPDATE OR DELETE ON history_horizon
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER history_horizon_no_truncate BEFORE TRUNCATE ON history_horizon
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
