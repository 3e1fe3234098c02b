-- Naive fenced reserve on one hot row: a single UPDATE that decrements when stock is available
-- and only while the partition's lease still names this holder at this epoch, unexpired.
\set sku 1
UPDATE naive_stock s
   SET available = s.available - 1, held = s.held + 1
  FROM naive_lease l
 WHERE s.sku = :sku AND s.available >= 1
   AND l.partition = s.partition AND l.holder = 'pgbench' AND l.epoch = 1 AND l.expires_at > now();
