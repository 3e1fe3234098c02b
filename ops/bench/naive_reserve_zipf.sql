-- Naive fenced reserve, SKU Zipf-distributed over the :skus rows with exponent 1.1 (rank k drawn
-- with p ∝ 1/k^1.1, like `loadtest run --skew zipf:1.1`; pgbench -D skus=N): the same single
-- UPDATE as naive_reserve_hot.sql.
\set sku random_zipfian(1, :skus, 1.1)
UPDATE naive_stock s
   SET available = s.available - 1, held = s.held + 1
  FROM naive_lease l
 WHERE s.sku = :sku AND s.available >= 1
   AND l.partition = s.partition AND l.holder = 'pgbench' AND l.epoch = 1 AND l.expires_at > now();
