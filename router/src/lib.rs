//! The router: the public face of the fenced inventory allocator (DESIGN.md §3, §4, §9).
//!
//! Routers are stateless replicas in front of the allocators. For every request the router
//! computes the SKU's partition with the one shared hash
//! ([`schema::partition::partition_for`]), looks the partition's owner up in its cached
//! assignment map and forwards the request there, carrying the assignment revision and the epoch
//! it expects the owner to hold. It never decides anything about stock itself: PostgreSQL, via
//! the allocator that owns the partition, is the only authority.
//!
//! How the pieces fit:
//!
//! * [`assignment_cache`] holds the partition → owner map, replaced only by newer reads of
//!   PostgreSQL (monotonic in revision). Over several shards (PostgreSQL primaries, DESIGN.md
//!   §12) it keeps one map per shard, each in its own revision order, and places partitions by
//!   the catalog's shard map; [`db`] gives every shard its own fence and pools, and an order is
//!   stored on the shard its id hashes to.
//! * [`hints`] subscribes to the Redis hints the allocators publish and [`poll`] re-reads
//!   periodically; both only *trigger* re-reads, so routing stays correct with Redis down.
//! * [`forward`] sends one request to the owner and retries, with the same id, on `421`, `503`,
//!   connect errors and timeouts within a deadline ([`retry`] holds the pure backoff and
//!   classification rules).
//! * [`orders`] turns a multi-line order into deterministic per-line reservations, all or none.
//! * [`routes`] is the HTTP surface, [`app`] wires everything and owns the shutdown signal.
//! * [`stages`] times each forwarded request's stages (accept, map, connect, upstream, retry,
//!   reply) for the stage histograms and the `Server-Timing` header.
//! * [`console`] serves people: the API document and its page, and the live operations page.
//!
//! The binary (`src/main.rs`) only parses the command line, sets up logging and runs
//! [`app::Application`].

pub mod app;
pub mod assignment_cache;
pub mod config;
pub mod console;
pub mod db;
pub mod error;
pub mod forward;
pub mod hints;
pub mod ids;
pub mod metrics;
pub mod orders;
pub mod poll;
pub mod retry;
pub mod routes;
pub mod settlement;
pub mod state;
pub mod upstream;

pub use app::Application;
pub use config::RouterConfig;
