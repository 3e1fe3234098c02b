-- Load SKUs straight into the allocator's schema, in one transaction: the inventory rows, the
-- restock adjustment and its ledger row, exactly what a first `POST .../adjustments` writes.
-- stdin carries `sku,partition` lines from `loadtest partitions`, which computes the partition
-- with the allocator's own function (allocator::partition::partition_for), so the stored
-- partitions are the ones the allocators and routers compute. psql variable: stock.
\set ON_ERROR_STOP on
BEGIN;
CREATE TEMP TABLE seed_skus (sku text PRIMARY KEY, partition integer NOT NULL) ON COMMIT DROP;
\copy seed_skus FROM pstdin WITH (FORMAT csv)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM seed_skus, cluster_settings WHERE partition >= partition_count) THEN
        RAISE EXCEPTION 'partition out of range: loadtest partitions --partitions differs from the cluster';
    END IF;
END $$;
INSERT INTO inventory (sku, partition, on_hand, available, highest_epoch)
SELECT sku, partition, :stock, :stock, 1 FROM seed_skus;
INSERT INTO adjustments (adjustment_id, sku, partition, delta, status, epoch, on_hand_after, available_after)
SELECT 'seed-' || sku || '-' || :stock, sku, partition, :stock, 'applied', 1, :stock, :stock FROM seed_skus;
-- Numbered after each partition's last ledger position, and the counters raised, as the fenced
-- batch does (V12__ledger_positions.sql); unnumbered rows would be numbered one at a time.
INSERT INTO ledger_positions AS p (partition, last_position)
SELECT DISTINCT partition, 0 FROM seed_skus
ON CONFLICT (partition) DO NOTHING;
INSERT INTO ledger (sku, partition, kind, adjustment_id, d_on_hand, d_available, d_held, d_confirmed, epoch, position)
SELECT s.sku, s.partition, 'restock', 'seed-' || s.sku || '-' || :stock, :stock, :stock, 0, 0, 1,
       p.last_position + row_number() OVER (PARTITION BY s.partition ORDER BY s.sku)
  FROM seed_skus AS s JOIN ledger_positions AS p ON p.partition = s.partition;
UPDATE ledger_positions AS p SET last_position = p.last_position + n.rows
  FROM (SELECT partition, count(*) AS rows FROM seed_skus GROUP BY partition) AS n
 WHERE p.partition = n.partition;
COMMIT;
