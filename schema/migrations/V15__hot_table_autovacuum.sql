-- Per-table autovacuum settings for the hot tables, from a measurement (README "Retention and
-- the idempotency horizon"): `ops/bench.sh growth`'s steady phase (one durable PostgreSQL,
-- shared_buffers 256MB, 500 reserves/s over 10k SKUs, half confirmed, the rest released or
-- expired after 5 s, horizon 20 s), read from pg_stat_user_tables after 105 s with the server
-- defaults:
--
--   table         inserts  updates  HOT updates  live    dead    autovacuums
--   inventory     10000    104981   100.0 %      10000   248     1
--   leases        18       1133     99.4 %       18      18      0
--   reservations  54001    51065    0.0 %        9998    45971   1
--
-- inventory and leases: every update is heap-only (no indexed column changes, and in-page
-- pruning finds room: inventory has kept 30 % of each page free since V9's fillfactor 70, and
-- leases are few), so the fillfactors stay as they are; dead tuples stay a few percent of the
-- rows.
-- They are small and rewritten all the time, so a threshold in rows rather than a fraction of
-- the table keeps their dead tuples bounded whatever the SKU count.
ALTER TABLE inventory SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 2000);
ALTER TABLE leases SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 200);

-- reservations: no update is heap-only (a status change moves the row between the partial
-- indexes), and the retention job deletes as fast as reserves insert, so dead tuples outnumbered
-- live rows 4.6 to 1 between the default's vacuums (20 % of the table, one run a minute). A 2 %
-- fraction, for inserts too (the visibility map the reserve statement's index probes rely on),
-- and a five times larger cost budget keep a run short on a table of tens of millions of rows.
ALTER TABLE reservations SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 1000
);
