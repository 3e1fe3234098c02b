//! Allocator replica library.
//!
//! An allocator replica owns a share of the cluster's partitions through leases in PostgreSQL,
//! runs one worker per owned partition that applies reservation commands in fenced transactions,
//! and serves the HTTP API. What it shares with the router and the load generator (wire types,
//! route table, partition hash, assignment map, migrations) lives in the `schema` crate.
//!
//! Layers, each depending only on those below it:
//!
//! 1. [`api`] — HTTP handlers; map worker errors and outcomes to HTTP answers.
//! 2. [`dispatch`] — find the local owner of a partition, queue a command, await the answer.
//! 3. [`replica`] — the ownership table and the lease manager's tasks (campaign, renew,
//!    watchdog, hand-back), which spawn and supervise workers; beside it the lease-guarded
//!    [`singleton`] jobs, [`settlement`] and [`retention`].
//! 4. [`worker`] — one task per owned partition: batching, sweeps, authority checks; it sees
//!    its lease only through an [`authority::PartitionAuthority`] and takes [`work::WorkItem`]s.
//! 5. [`commit`] — group commit lanes sharing one statement between partitions.
//! 6. [`fenced`] — the fenced statement itself: commands, fence, driver, reservations,
//!    adjustments, ledger.
//! 7. [`lease`] — the pure lease state machine, the lease SQL and the [`lease::FenceToken`].
//!
//! Beside the replica layer: [`settlement`] (the singleton job) and [`events`] (the change-event
//! relay it runs under its lease).
//!
//! Beside them: [`app`] wires everything together; [`clock`], [`config`], [`sessions`], [`error`],
//! [`faults`], [`hint_publisher`], [`metrics`] and [`stages`] are leaves. Signals, logs, request ids, pool settings
//! and the problems of requests no handler sees come from the `edge` crate, shared with the router.
pub mod api;
pub mod app;
pub mod authority;
pub mod clock;
pub mod commit;
pub mod config;
pub mod dispatch;
pub mod error;
pub mod events;
pub mod faults;
pub mod fenced;
pub mod hint_publisher;
pub mod lease;
pub mod metrics;
pub mod negative_control;
pub mod replica;
pub mod retention;
pub mod sessions;
pub mod settlement;
pub mod shard;
pub mod singleton;
pub mod stages;
pub mod work;
pub mod worker;
