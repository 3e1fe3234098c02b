//! The contracts of the fenced inventory allocator: everything the allocator replicas, the router
//! and the load generator must agree on, and nothing else.
//!
//! * [`migrate`]: the SQL schema (versioned migrations) and cluster initialisation.
//! * [`functions`]: the stored functions kept whole in `functions/<name>.sql`, installed after
//!   the migrations.
//! * [`wire`]: HTTP request and response bodies, headers, limits, problem types and validation.
//! * [`routes`]: the HTTP route table both services register and the API document describes.
//! * [`openapi`]: each service's API document, derived from the shared one, and the page that
//!   renders it.
//! * [`path`]: percent-encoding of one path segment, for clients that build URLs from ids.
//! * [`partition`]: the stable SKU → partition hash and lease naming.
//! * [`assignment`]: the partition → owner map as read from PostgreSQL and the reservation →
//!   partition lookup (feature `postgres`, like [`migrate`]).
//! * [`settlement`]: the settlement job's status (feature `postgres`).
//! * [`shard`]: which PostgreSQL primary (shard) holds each partition: the catalog's map and
//!   each shard's own record, which must agree.
//! * [`hint`]: the assignment change hints published on Redis, and their channel.
//! * [`events`]: the change events (the ledger as an outbox) and their JSON Schemas; reading
//!   them from PostgreSQL with feature `postgres`.
//! * [`history`]: one SKU's ledger with the client of each movement (`GET
//!   /v1/inventory/{sku}/history`); reading it from PostgreSQL with feature `postgres`.
//!
//! The crate has no HTTP server, pool or Redis client in it, so a consumer that only needs the
//! types (the load generator) does not compile the allocator's runtime.

#[cfg(feature = "postgres")]
pub mod assignment;
#[cfg(feature = "postgres")]
mod error;
pub mod events;
pub mod functions;
pub mod hint;
pub mod history;
#[cfg(feature = "postgres")]
pub mod migrate;
pub mod openapi;
mod page;
pub mod partition;
pub mod path;
pub mod routes;
#[cfg(feature = "postgres")]
pub mod settlement;
pub mod shard;
pub mod wire;

#[cfg(feature = "postgres")]
pub use migrate::{
    initialise, initialise_with, partition_count, InitOptions, MigrationReport, SchemaError,
    ShardRole, DEFAULT_PARTITIONS, MAX_PARTITIONS, SETTLEMENT_LEASE,
};
