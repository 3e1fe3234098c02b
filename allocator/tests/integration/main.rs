//! The allocator's integration tests, in one binary so that they link once.

mod api;
mod audit;
mod auth;
mod batch_equivalence;
#[allow(dead_code)]
mod common;
mod config;
mod events;
mod events_faults;
mod events_restarts;
mod events_support;
mod failover;
mod fast_path;
mod fencing;
mod hardening;
mod held_units;
mod history;
mod lease_exclusivity;
mod ledger_archive;
mod ledger_archive_job;
mod ledger_partitions;
mod ledger_support;
mod lifecycle;
mod openapi;
mod owners;
mod owners_fenced;
mod processes;
mod renewal;
mod retention;
mod retention_support;
mod settlement;
mod settlement_support;
mod settlement_takeover;
mod tenants;
mod tenures;
mod testkit_smoke;
