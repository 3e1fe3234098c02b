//! Allocator replica library.
//!
//! An allocator replica owns a share of the cluster's partitions through leases in PostgreSQL
//! ([`lease`]), runs one worker per owned partition ([`worker`]) that applies reservation commands
//! in fenced transactions ([`fenced`]), and serves the HTTP API ([`api`]). What it shares with the
//! router and the load generator (wire types, route table, partition hash, assignment map,
//! migrations) lives in the `schema` crate.
pub mod api;
pub mod app;
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
pub mod request_id;
pub mod signals;
pub mod telemetry;
pub mod worker;
