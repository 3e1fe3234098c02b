//! Allocator replica library.
//!
//! An allocator replica owns a share of the cluster's partitions through leases in PostgreSQL
//! ([`lease`]), runs one worker per owned partition ([`worker`]) that applies reservation commands
//! in fenced transactions ([`fenced`]), and serves the HTTP API ([`api`]). Routers and load
//! generators use the shared pieces: the SKU hash ([`partition`]), wire types ([`wire`]) and the
//! assignment map ([`assignment`]).
pub mod api;
pub mod app;
pub mod assignment;
pub mod clock;
pub mod commit;
pub mod config;
pub mod db;
pub mod error;
pub mod faults;
pub mod fenced;
pub mod hints;
pub mod lease;
pub mod metrics;
pub mod partition;
pub mod signals;
pub mod telemetry;
pub mod wire;
pub mod worker;

#[cfg(feature = "testkit")]
pub mod testkit;
