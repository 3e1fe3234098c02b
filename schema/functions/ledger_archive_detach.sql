-- ledger_archive_detach: archive the oldest ledger time partition once its export is written.
--
-- This file is the function's text, whole. `allocator migrate` installs it after the migrations
-- (schema/src/functions.rs) and records its revision and SHA-256 in `schema_functions`; no
-- migration edits the function any more. A change to this text is a new revision: raise the
-- function's revision in schema/src/functions.rs with it and keep the signature (the archive
-- job of the previous release calls it during a rolling upgrade). Its history up to revision 1
-- is in the migrations: V17 created it, V25 replaced it to lock the partition before counting.
--
-- `p` is refused (the reason returned, nothing changed) unless ledger_archive_refusal() (V17)
-- allows it: the oldest partition, older than the idempotency `horizon`, settled, and relayed
-- when the cluster relays change events (`require_relay`). The call fails if the partition does
-- not hold exactly the `exported` rows the export `file` (digest `sha256`) holds. Otherwise it
-- records the archive, adds the partition's per-SKU sums to ledger_archived_totals, then
-- detaches and drops the partition, in one transaction: the rows are either in the ledger or in
-- the archive's record, never both or neither. The detach takes the ledger's ACCESS EXCLUSIVE
-- lock until commit (catalog changes only); the caller bounds every wait with lock_timeout.
-- Returns NULL once archived.
CREATE OR REPLACE FUNCTION ledger_archive_detach(p text, horizon interval, require_relay boolean,
                                                 exported bigint, file text, sha256 text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    refusal text;
    part    ledger_partitions;
    a       record;
BEGIN
    refusal := ledger_archive_refusal(p, horizon, require_relay);
    IF refusal IS NOT NULL THEN
        RETURN refusal;
    END IF;
    -- The partition's SHARE lock first (V25). Inserts into the partition committed before this
    -- are counted below; later ones wait for this transaction, so the count and sums are exactly
    -- what is dropped. Counting first and locking at the detach dropped rows a partition move
    -- appended in between, in neither the file nor the totals. A move's copy holds the ledger's
    -- ROW EXCLUSIVE lock while it inserts, so it and the detach below wait for each other; the
    -- caller's lock_timeout makes the archive give way (and try again later).
    EXECUTE format('LOCK TABLE %I IN SHARE MODE', p);
    SELECT * INTO part FROM ledger_partitions WHERE name = p;
    EXECUTE format('SELECT count(*) AS rows, min(entry_id) AS first, max(entry_id) AS last,
                           coalesce(sum(d_on_hand), 0) AS on_hand,
                           coalesce(sum(d_available), 0) AS available,
                           coalesce(sum(d_held), 0) AS held,
                           coalesce(sum(d_confirmed), 0) AS confirmed
                      FROM %I', p) INTO a;
    IF a.rows <> exported THEN
        RAISE EXCEPTION 'ledger partition % holds % rows, its export %', p, a.rows, exported;
    END IF;
    EXECUTE format('INSERT INTO ledger_archived_totals AS t
                        (sku, rows, d_on_hand, d_available, d_held, d_confirmed)
                    SELECT sku, count(*), sum(d_on_hand), sum(d_available), sum(d_held),
                           sum(d_confirmed)
                      FROM %I GROUP BY sku
                    ON CONFLICT (sku) DO UPDATE
                       SET rows = t.rows + EXCLUDED.rows,
                           d_on_hand = t.d_on_hand + EXCLUDED.d_on_hand,
                           d_available = t.d_available + EXCLUDED.d_available,
                           d_held = t.d_held + EXCLUDED.d_held,
                           d_confirmed = t.d_confirmed + EXCLUDED.d_confirmed', p);
    INSERT INTO ledger_archives (name, range_start, range_end, rows, first_entry_id,
                                 last_entry_id, d_on_hand, d_available, d_held, d_confirmed,
                                 file, sha256)
    VALUES (p, part.range_start, part.range_end, a.rows, a.first, a.last, a.on_hand,
            a.available, a.held, a.confirmed, file, sha256);
    EXECUTE format('ALTER TABLE ledger DETACH PARTITION %I', p);
    EXECUTE format('DROP TABLE %I', p);
    DELETE FROM ledger_partitions WHERE name = p;
    RETURN NULL;
END $$;
