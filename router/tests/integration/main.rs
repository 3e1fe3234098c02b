//! The router's integration tests, in one binary so that they link once.

mod api;
mod auth;
mod auth_upstream;
#[allow(dead_code)]
mod common;
mod encoded_paths;
mod failover;
mod failover_redis;
mod give_up;
mod handoff;
mod held_units;
mod history;
mod hold_quota;
mod hostile_input;
mod in_flight;
mod isolation;
mod openapi;
mod order_lock;
mod order_races;
mod orders;
mod owners;
mod pooling;
mod prometheus;
mod request_id;
mod routing;
mod shard_events;
mod shard_ids;
mod shard_orders;
mod shard_reads;
mod shard_settlement;
mod shards;
mod stages;
mod storage_failover;
mod tenants;
mod tls;
mod ui;
