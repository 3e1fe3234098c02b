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
