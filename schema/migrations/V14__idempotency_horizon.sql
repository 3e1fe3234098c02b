-- The idempotency horizon (DESIGN.md §8a): the retention job removes terminal reservations and
-- finished orders whose last change is older than the configured horizon.
--
-- The job finds the oldest such rows by these partial indexes, so a batch reads only rows it
-- removes. A held reservation and a pending order are in neither index (their updates and
-- inserts do not touch them); a reservation enters its index when it reaches a terminal state,
-- which already writes a new index entry (the status is in the held-expiry index's predicate).
--
-- On a database that already holds many rows, build them first by hand without blocking writes:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS reservations_terminal_age ...  (the same definition)
-- and this migration leaves them as they are.
CREATE INDEX IF NOT EXISTS reservations_terminal_age
    ON reservations (updated_at) WHERE status <> 'held';
CREATE INDEX IF NOT EXISTS orders_finished_age
    ON orders (updated_at) WHERE status <> 'pending';

-- The ledger names reservations by id only (V2 dropped the foreign key), so it keeps every row
-- and its meaning when a reservation is removed: each row balances on its own and settlement
-- sums the ledger, never the reservations.

-- The job's lease, a singleton like 'job/settlement'. Its epoch is the job's term; every removal
-- statement reads this row FOR KEY SHARE and removes nothing unless it names the holder at that
-- term, unexpired.
INSERT INTO leases (name) VALUES ('job/retention') ON CONFLICT (name) DO NOTHING;
