-- The set-based reserve statement's guard (allocator/src/fenced/fast.rs, DESIGN.md §6).
--
-- Groups of plain reserves (new ids, stocked SKUs with enough stock for every reserve of the SKU
-- in the group) are written by one prepared statement, a chain of data-modifying CTEs, instead of
-- apply_fenced_batch: the same fence (the lease row FOR KEY SHARE, holder, epoch, expiry), the
-- same rows, the same CHECKs and epoch trigger, without the procedural function's per-call
-- and per-command cost. The statement decides whether it can write everything before it writes
-- anything; when a row it decided on changes under it (an outside writer between its snapshot
-- and its row lock), its counts disagree and it calls this function, which aborts the statement
-- (SQLSTATE FA006): nothing is written, and the caller runs the group through
-- apply_fenced_batch instead.
CREATE FUNCTION fenced_batch_abort(reason text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'set-based reserve statement aborted: %', reason USING ERRCODE = 'FA006';
END $$;

-- Room on every inventory page for the row's next version: a reserve changes only columns no
-- index covers, so with free space on the page the update is a heap-only (HOT) update that
-- writes no index entry; on a full page it writes one into each of the table's indexes. Applies
-- to pages filled from now on (a table's existing pages keep their layout until rewritten).
ALTER TABLE inventory SET (fillfactor = 70);

-- One index entry less for every ledger row (every reserve, confirm, release and expiry writes
-- one): nothing in the services looks a reservation's movements up, the settlement job reads
-- the ledger by confirmation time and the checker reads it whole. A reservation's movements are
-- still found through ledger_sku, filtered by reservation_id (a reservation has at most two).
DROP INDEX ledger_reservation_id;
