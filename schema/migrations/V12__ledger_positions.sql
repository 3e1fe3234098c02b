-- Per-partition, gap-free, commit-ordered positions on every ledger row (DESIGN.md §14).
--
-- The ledger is the outbox of the change events: a relay publishes each partition's rows in
-- position order and records how far it got. That needs positions that are dense (a consumer
-- that has 1..n and sees n+2 knows n+1 exists) and in commit order (a row at position n+1 never
-- becomes visible after the relay has moved past it). `entry_id` is neither: a bigserial is taken
-- before commit, so concurrent writers commit out of order, and a rolled-back statement leaves a
-- hole.
--
-- `ledger_positions` holds one counter per partition: the last position given. The fenced batch
-- (both the set-based reserve statement and apply_fenced_batch) adds its row count to the
-- partition's counter in the same transaction as its ledger rows and numbers them from there.
-- The counter's row lock is held until commit, so a second writer of the partition (there is
-- none while the fence works: one owner, one batch at a time) would wait and number after it;
-- a rollback rolls the counter back with the rows. Positions are therefore contiguous and
-- in commit order per partition, whoever writes.
--
-- Any writer that does not number its rows (an operator's INSERT, the benchmark's seed, a
-- function from a migration that predates this one) is numbered one row at a time by the trigger
-- below; the batch paths never pay for it, because the trigger's WHEN clause is checked without
-- calling the function. Each such row updates the counter row once more in the same transaction,
-- so a bulk load of many rows must number them itself (from the counter, then raise it) the way
-- the batch paths do.

CREATE TABLE ledger_positions (
    partition     integer PRIMARY KEY CHECK (partition >= 0),
    last_position bigint NOT NULL CHECK (last_position >= 0)
);

ALTER TABLE ledger ADD COLUMN position bigint;

-- Rows written before positions existed are numbered in entry_id order, the best order known
-- for them. The append-only trigger is suspended for this one statement of the migration.
ALTER TABLE ledger DISABLE TRIGGER ledger_append_only;
UPDATE ledger AS l
   SET position = n.position
  FROM (SELECT entry_id, row_number() OVER (PARTITION BY partition ORDER BY entry_id) AS position
          FROM ledger) AS n
 WHERE l.entry_id = n.entry_id;
ALTER TABLE ledger ENABLE TRIGGER ledger_append_only;

INSERT INTO ledger_positions (partition, last_position)
SELECT partition, 0 FROM leases WHERE partition IS NOT NULL
ON CONFLICT (partition) DO NOTHING;
INSERT INTO ledger_positions AS p (partition, last_position)
SELECT partition, max(position) FROM ledger GROUP BY partition
ON CONFLICT (partition) DO UPDATE SET last_position = EXCLUDED.last_position;

ALTER TABLE ledger ALTER COLUMN position SET NOT NULL;
ALTER TABLE ledger ADD CONSTRAINT ledger_position_positive CHECK (position >= 1);
-- The relay's and GET /v1/events' read path, and the guarantee that a position is given once.
CREATE UNIQUE INDEX ledger_partition_position ON ledger (partition, position);

CREATE FUNCTION ledger_number_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_positions AS p (partition, last_position) VALUES (NEW.partition, 1)
    ON CONFLICT (partition) DO UPDATE SET last_position = p.last_position + 1
    RETURNING p.last_position INTO NEW.position;
    RETURN NEW;
END $$;
CREATE TRIGGER ledger_number_row BEFORE INSERT ON ledger
    FOR EACH ROW WHEN (NEW.position IS NULL) EXECUTE FUNCTION ledger_number_row();

-- apply_fenced_batch numbers its rows set-based: its one ledger INSERT (V7) is replaced in the
-- function's current definition, whatever else later migrations changed in it. The replacement
-- must match exactly once; otherwise the migration fails rather than leave the function on the
-- per-row trigger unnoticed.
DO $migrate$
DECLARE
    old_insert constant text := $old$
        INSERT INTO ledger (sku, partition, kind, reservation_id, adjustment_id,
                            d_on_hand, d_available, d_held, d_confirmed, epoch)
        SELECT * FROM unnest(l_sku, l_part, l_kind, l_rid, l_aid, l_on_hand, l_avail, l_held,
                             l_conf, l_epoch);$old$;
    new_insert constant text := $new$
        -- Number the rows per partition, in decision order, from the partition's counter
        -- (V12__ledger_positions.sql); the counter row stays locked until commit.
        WITH rows AS (
                 SELECT u.*
                   FROM unnest(l_sku, l_part, l_kind, l_rid, l_aid, l_on_hand, l_avail, l_held,
                               l_conf, l_epoch)
                        WITH ORDINALITY AS u(sku, part, kind, rid, aid, on_hand, avail, held,
                                             conf, epoch, ord)),
             counts AS (
                 SELECT part, count(*) AS n FROM rows GROUP BY part ORDER BY part),
             numbered AS (
                 UPDATE ledger_positions AS p
                    SET last_position = p.last_position + c.n
                   FROM counts AS c
                  WHERE p.partition = c.part
              RETURNING p.partition, p.last_position - c.n AS base)
        INSERT INTO ledger (sku, partition, kind, reservation_id, adjustment_id,
                            d_on_hand, d_available, d_held, d_confirmed, epoch, position)
        SELECT r.sku, r.part, r.kind, r.rid, r.aid, r.on_hand, r.avail, r.held, r.conf, r.epoch,
               b.base + row_number() OVER (PARTITION BY r.part ORDER BY r.ord)
          FROM rows AS r
          LEFT JOIN numbered AS b ON b.partition = r.part
         ORDER BY r.ord;$new$;
    definition text;
BEGIN
    SELECT pg_get_functiondef('apply_fenced_batch'::regproc) INTO definition;
    IF array_length(string_to_array(definition, old_insert), 1) IS DISTINCT FROM 2 THEN
        RAISE EXCEPTION 'apply_fenced_batch: its ledger INSERT is not the one V12 replaces';
    END IF;
    EXECUTE replace(definition, old_insert, new_insert);
END $migrate$;
