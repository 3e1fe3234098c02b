//! A Jepsen-style fault run for the fenced inventory allocator, and an independent checker.
//!
//! The `chaos` binary starts a private PostgreSQL and Redis, three allocator replicas (each
//! behind its own TCP proxy to PostgreSQL) and two routers (authentication on, one client
//! rate-limited) as real processes, drives a mixed workload through both routers while a seeded
//! schedule injects faults, and records:
//!
//! * `history.jsonl` — one line per client operation: invoke and completion times (monotonic
//!   milliseconds since the start and wall-clock milliseconds), client, router, kind, request,
//!   and the response status and body, or the error with outcome `unknown`;
//! * `faults.jsonl` — one line per injected fault: kind, target, start and end;
//! * `dump.json` — the database at the end: inventory, reservations, ledger (with each row's
//!   write time, transaction start and event position), the relay's recorded progress,
//!   adjustments, orders (with their stored requests),
//!   leases, the lease history and its horizon, settlement runs and per-SKU totals, the archived
//!   ledger partitions with their per-SKU sums, and the dump's time with the idempotency
//!   horizon (before it, the retention job may have removed finished reservations and orders);
//!   over several shards (`--shards N`), `dump-<shard>.json` for each shard and `shards.json`,
//!   which names them in order with the partitions the catalog's map gives each;
//! * `events.jsonl` — every change event the run's consumer (`loadtest events`, running through
//!   the whole schedule) received, in order, and `events.heads.json`, each stream's last
//!   position read after the consumer stopped;
//! * `summary.json` — seed, duration, faults per kind and each process's resident memory at the
//!   start and the end.
//!
//! The `chaos-check` binary ([`check`]) reads those files and nothing else. It shares no code
//! with the allocator, the router or the schema crate — only `std` and `serde_json` — so a bug
//! in their logic cannot hide itself by being repeated in the checker.

pub mod check;
/// Writes `dump.json` from a live database (the harness's last step; also used by tests).
pub mod dump;
/// Every shard's client and the run-wide names of its streams, for the end of a run.
pub mod shards;
