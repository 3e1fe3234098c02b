-- V25: archiving a ledger partition takes its SHARE lock before counting it. ledger_archive_detach
-- (V17) counted and summed the partition under a READ COMMITTED snapshot and only then waited
-- for the ledger's ACCESS EXCLUSIVE lock to detach it; a row committed into the partition in
-- between was dropped with it, in neither the archive's file nor its totals. The allocators
-- never write into a partition past the horizon, but a partition move (`allocator shards move`,
-- DESIGN.md §12) appends a moved partition's older rows into the target's time partitions, the
-- oldest included; the chaos run over shards lost 51 such rows. The SHARE lock waits for
-- uncommitted inserts into the partition and holds off new ones until the drop commits; the
-- caller's lock_timeout still bounds every wait. The rest of the function is unchanged.
CREATE OR REPLACE FUNCTION ledger_archive_detach(p text, horizon interval, require_relay boolean,
                                      exported bigint, file text, sha256 text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    refusal text;
    part    ledger_partitions;
    a       record;
BEGIN
    refusal := ledger_archive_refusal(p, horizon, require_relay);
    IF refusal IS NOT NULL THEN
        RETURN refusal;
    END IF;
    -- Inserts into the partition committed before this are counted below; later ones wait for
    -- this transaction, so the count and sums are exactly what is dropped. A move's copy holds
    -- the ledger's ROW EXCLUSIVE lock while it inserts, so it and the detach below wait for each
    -- other; the caller's lock_timeout makes the archive give way (and try again later).
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
