//! A typed client of the fenced inventory allocator's HTTP API, for order services and operators.
//!
//! One method per route of [`schema::routes`] that a caller uses: [`Client::reserve`],
//! [`Client::reservation`], [`Client::confirm`], [`Client::release`], [`Client::inventory`],
//! [`Client::adjust`], [`Client::order`], [`Client::partitions`], [`Client::settlement`],
//! [`Client::events`], [`Client::health`] and [`Client::ready`]. Bodies and answers are the
//! [`schema::wire`] types; paths are built from the route table with every segment
//! percent-encoded ([`schema::path`]). The same client talks to a router (the public entry point)
//! or straight to an allocator replica.
//!
//! # The retry and idempotency contract
//!
//! Every call that changes something carries an id: the reservation id of a reserve (and of its
//! confirm or release, in the path), the adjustment id of a stock adjustment, the order id of an
//! order. A service that already knows the id answers with the stored outcome instead of applying
//! the request again (`Idempotent-Replayed: true`, [`Reply::replayed`]). That is what makes
//! retrying safe, and this client retries:
//!
//! * **What is retried**: outcomes that leave it open whether anything happened or that ask to try
//!   again — a timeout, a refused or broken connection, `503` (no confirmed owner right now; its
//!   `Retry-After` is honoured up to the backoff's cap), `421` (an allocator that does not own the
//!   partition), `502`/`504` (a router that gave up upstream). Every other answer is final.
//! * **With the same request**: the same id and the same body on every attempt, so at most one
//!   attempt takes effect and the others replay it.
//! * **Until a deadline**: each attempt gets the per-attempt timeout (never past the deadline);
//!   between attempts the client waits by the workspace's one [`backoff::Backoff`] (capped
//!   exponential with equal jitter). [`Builder::deadline`] and [`Builder::attempt_timeout`] set
//!   both, [`Call::deadline`] and [`Call::once`] change them for one call.
//! * **Unknown outcomes are surfaced, never guessed**: when the deadline passes and an attempt may
//!   have been applied (a timeout or a connection lost after the request was written, or a
//!   router's problem saying `outcome_unknown: true`), the call fails with
//!   [`Error::OutcomeUnknown`] carrying the id it used. Retry later with the same id to learn the
//!   outcome; a new id could hold stock twice. "May have been applied" sticks across attempts: a
//!   timeout followed by a refusal that does not look at the id (`401`, `403`, `429`) is still
//!   unknown. When no attempt can have been applied, the call fails with [`Error::Unavailable`].
//! * **Ids made for the caller**: [`ids`] makes random 128-bit ids; [`new_reservation`],
//!   [`new_adjustment`] and [`ids::order_id`] build requests with a fresh one. Keep the id (it is
//!   in the request you pass, and in [`Error::OutcomeUnknown`]) until the outcome is known.
//!
//! Refusals come as typed errors named after the problem types ([`schema::wire::ProblemType`]):
//! [`Error::InsufficientStock`], [`Error::NotFound`], [`Error::IdempotencyMismatch`],
//! [`Error::InvalidState`], [`Error::OrderFailed`] (with each line's outcome),
//! [`Error::RateLimited`] (with `Retry-After`), [`Error::Unauthorized`], [`Error::Forbidden`],
//! [`Error::Invalid`], and the others in [`Error`].
//!
//! # Example
//!
//! ```no_run
//! use allocator_client::{new_adjustment, new_reservation, Client, Error};
//!
//! # async fn demo() -> Result<(), Error> {
//! let client = Client::builder("http://127.0.0.1:8080").token("secret").build()?;
//! client.adjust("widget", &new_adjustment(10)?).await?;
//! let request = new_reservation("widget", 2)?;
//! match client.reserve(&request).await {
//!     Ok(held) => println!("held {} until {:?}", held.value.reservation_id, held.value.expires_at),
//!     Err(Error::InsufficientStock(problem)) => println!("only {:?} left", problem.available),
//!     // Nothing is lost: the same request (same id) later tells what happened.
//!     Err(Error::OutcomeUnknown { id, .. }) => println!("retry {id:?} later"),
//!     Err(other) => return Err(other),
//! }
//! # Ok(()) }
//! ```
//!
//! `examples/walkthrough.rs` runs the whole contract against a live router (restock, reserve,
//! replay, out of stock, confirm, release, a multi-line order) and exits non-zero when an answer
//! differs from it.
//!
//! # Transport
//!
//! HTTP/1.1 through hyper-util's pooled client, with no redirects and no retries but the ones
//! above; requests are built from a base URL checked once. It is the load generator's client, so
//! it is kept cheap per request. `https://` base URLs need the `tls` feature and a
//! `rustls::ClientConfig` (`Builder::tls`); a client given one refuses an `http://` base URL, so
//! its token never crosses in clear text.
//!
//! Without the default `http` feature only [`backoff`], [`ids`] and the rules of [`retry`] are
//! compiled: the services' edge shares the backoff, and the router the retry rules, without
//! linking this HTTP client.

/// Items of the `http` feature (the client itself), under one attribute instead of one each.
macro_rules! http_only {
    ($($item:item)*) => {
        $(#[cfg(feature = "http")] $item)*
    };
}

pub mod backoff;
pub mod ids;
pub mod retry;

http_only! {
    mod api;
    mod call;
    mod client;
    mod error;
    mod order;
    mod transport;

    pub use api::{new_adjustment, new_reservation, route_path};
    pub use call::{Call, Reply};
    pub use client::{BuildError, Builder, Client};
    pub use error::{Error, Last};
    pub use order::{OrderFailure, OrderLineReport, OrderPlaced};
    pub use retry::{Attempt, FailureKind, Observe, Policy};
    pub use transport::{Response, TransportError};

    /// The HTTP vocabulary of [`Client::send_once`] and [`Response`].
    pub use http::{HeaderMap, Method, StatusCode};
    /// The wire types of the requests and answers, re-exported so a caller needs no second import.
    pub use schema::wire;
}
