//! The service edge of the allocator and the router: what both HTTP services do the same way,
//! written once so the two cannot drift.
//!
//! * [`canonical`]: the outermost middleware, which puts every request's path into its one
//!   canonical form before anything takes a decision on it;
//! * [`signals`]: waiting for SIGTERM/SIGINT to start a graceful shutdown;
//! * [`telemetry`]: JSON logs through `tracing` (DESIGN.md §10);
//! * [`request_id`]: the `X-Request-Id` middleware and the request's id on its task;
//! * [`timing`]: a request's stage breakdown as a `Server-Timing` header;
//! * [`metrics`]: the Prometheus exporter, installed once with each service's bucket table, and
//!   its upkeep timer (the metric names stay in each service's `metrics.rs`);
//! * [`pg`]: pooled PostgreSQL sessions behind the storage fence, with the same connect timeout,
//!   TCP keepalives and server-side statement/idle/lock timeouts in both services;
//! * [`problem`]: problem+json answers for what never reaches a handler (a body or path that does
//!   not parse, an unknown path, a method the path does not serve), in the same words on both;
//! * [`backoff`]: capped exponential backoff with jitter, and the jitter of periodic timers; the
//!   client crate's (`allocator_client::backoff`), so services and clients wait alike.

pub mod canonical;
pub mod metrics;
pub mod pg;
pub mod problem;
pub mod request_id;
pub mod signals;
pub mod telemetry;
pub mod timing;

pub use allocator_client::backoff::{self, Backoff};
