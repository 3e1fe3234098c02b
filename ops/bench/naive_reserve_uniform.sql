-- Naive fenced reserve, SKU uniform over the :skus rows (pgbench -D skus=N): the same single
-- UPDATE as naive_reserve_hot.sql.
\set sku random(1, :skus)
UPDATE naive_stock s
   SET available = s.available - 1, held = s.held + 1
  FROM naive_lease l
 WHERE s.sku = :sku AND s.available >= 1
   AND l.partition = s.partition AND l.holder = 'pgbench' AND l.epoch = 1 AND l.expires_at > now();
