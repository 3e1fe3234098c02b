-- The naive baseline's tables (pgbench rows of ops/bench.sh), in their own database: one stock
-- row per SKU and one lease row per partition naming the holder and its epoch.
\set ON_ERROR_STOP on
DROP TABLE IF EXISTS naive_stock, naive_lease;
CREATE TABLE naive_lease (
    partition  integer PRIMARY KEY,
    holder     text NOT NULL,
    epoch      bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
INSERT INTO naive_lease
SELECT p, 'pgbench', 1, now() + interval '1 day' FROM generate_series(0, :partitions - 1) AS p;
CREATE TABLE naive_stock (
    sku       bigint PRIMARY KEY,
    partition integer NOT NULL,
    available bigint NOT NULL CHECK (available >= 0),
    held      bigint NOT NULL DEFAULT 0 CHECK (held >= 0)
);
INSERT INTO naive_stock
SELECT s, s % :partitions, :stock, 0 FROM generate_series(1, :skus) AS s;
VACUUM ANALYZE naive_stock;
VACUUM ANALYZE naive_lease;
