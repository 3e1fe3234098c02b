//! Every metric the router exports: names, label values and histogram buckets in one place,
//! because they are a contract with the dashboards and alert rules in `ops/` (DESIGN.md §10).
//!
//! The Prometheus recorder is process-global; [`install`] installs it once and hands out the
//! same handle on later calls, so several in-process routers (tests) share one registry.
//! `/metrics` renders that handle.

use std::sync::OnceLock;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Forwarded client requests by final outcome (one per client request, not per attempt).
/// `outcome`: see [`ForwardOutcome`].
pub const FORWARDS_TOTAL: &str = "router_forwards_total";
/// Upstream attempts that were retried. `cause`: see [`crate::retry::RetryCause`].
pub const RETRIES_TOTAL: &str = "router_retries_total";
/// Latency of one upstream attempt (connect to full response), including failed attempts.
pub const UPSTREAM_LATENCY_SECONDS: &str = "router_upstream_latency_seconds";
/// Time from receiving a request to having an upstream answer or giving up, retries included.
pub const FORWARD_DURATION_SECONDS: &str = "router_forward_duration_seconds";
/// Revision of the assignment map the router routes by.
pub const ASSIGNMENT_REVISION: &str = "router_assignment_revision";
/// 1 while the Redis hint subscription is established and answering pings.
pub const REDIS_FEED_CONNECTED: &str = "router_redis_feed_connected";
/// Re-reads of the assignment map from PostgreSQL. `cause`: see [`RefreshCause`].
pub const MAP_REFRESHES_TOTAL: &str = "router_map_refreshes_total";
/// Re-reads that failed (PostgreSQL unreachable or slow); routing continues on the old map.
pub const MAP_REFRESH_FAILURES_TOTAL: &str = "router_map_refresh_failures_total";
/// Multi-line orders by outcome: `placed`, `replayed`, `failed`, `mismatch`, `unknown`,
/// `invalid`.
pub const ORDERS_TOTAL: &str = "router_orders_total";
/// Order submissions that lost (or could no longer rely on) their order's lock while working,
/// by `reason`: `closed` (the session ended: killed, restarted, cut), `keepalive` (a keep-alive
/// failed or timed out), `idle` (none confirmed within the idle timeout). Each stopped sending
/// and left its order undecided.
pub const ORDER_LOCKS_LOST_TOTAL: &str = "router_order_locks_lost_total";

/// Requests by `client` (the authenticated caller; `anonymous` with authentication off, `(none)`
/// when no valid token was shown) and `outcome`: `ok`, `unauthenticated`, `forbidden`,
/// `rate_limited`, `concurrency_limited`.
pub const CLIENT_REQUESTS_TOTAL: &str = "router_client_requests_total";
/// Auth file reloads (SIGHUP) by `outcome`: `ok`, `failed` (the previous table stays).
pub const AUTH_RELOADS_TOTAL: &str = "router_auth_reloads_total";
/// Clients in the auth table in force.
pub const AUTH_CLIENTS: &str = "router_auth_clients";
/// Answers of allocators that refused this router's own credential (`401`/`403`): a
/// misconfigured `--upstream-token-file` or allocator auth file.
pub const UPSTREAM_AUTH_FAILURES_TOTAL: &str = "router_upstream_auth_failures_total";

/// The names [`access::Gate`] records under.
pub const ACCESS_METRICS: access::MetricNames = access::MetricNames {
    client_requests: CLIENT_REQUESTS_TOTAL,
    auth_reloads: AUTH_RELOADS_TOTAL,
    auth_clients: AUTH_CLIENTS,
};

// Storage fence (DESIGN.md §13), recorded by the `storage` crate under these names.
/// Connection attempts that reached a server the fence refused, by `cause`: `behind` (an old
/// primary superseded by a promotion), `foreign` (another cluster, e.g. a restored copy),
/// `not_serving` (a copy being restored).
pub const STORAGE_REFUSALS: &str = "router_storage_refusals_total";
/// Connection attempts that reached a read-only server (a standby) while looking for the primary.
pub const STORAGE_READ_ONLY_CONNECTS: &str = "router_storage_read_only_connects_total";
/// Configured servers that accept writes but are behind the newest primary: a revived old
/// primary. Above 0 the HA manager failed to fence it.
pub const STORAGE_STALE_WRITABLE_SERVERS: &str = "router_storage_stale_writable_servers";
/// The newest WAL timeline and generation this process knows.
pub const STORAGE_TIMELINE: &str = "router_storage_timeline";
pub const STORAGE_GENERATION: &str = "router_storage_generation";
/// The primary's largest standby replay lag, seconds (`pg_stat_replication.replay_lag`).
pub const STORAGE_REPLICATION_LAG: &str = "router_storage_replication_lag_seconds";
/// The primary's synchronous standbys; 0 means an acknowledged commit may exist on the primary
/// alone.
pub const STORAGE_SYNC_STANDBYS: &str = "router_storage_sync_standbys";

/// The names [`storage::StorageFence`] records under.
pub const STORAGE_METRICS: storage::MetricNames = storage::MetricNames {
    refusals: STORAGE_REFUSALS,
    read_only_connects: STORAGE_READ_ONLY_CONNECTS,
    stale_writable_servers: STORAGE_STALE_WRITABLE_SERVERS,
    timeline: STORAGE_TIMELINE,
    generation: STORAGE_GENERATION,
    replication_lag: STORAGE_REPLICATION_LAG,
    sync_standbys: STORAGE_SYNC_STANDBYS,
};

/// Buckets for upstream latency: sub-millisecond local hops up to the 5 s retry deadline.
pub const UPSTREAM_LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Buckets for the whole forward: retries push it to the deadline, so the tail reaches 10 s.
pub const FORWARD_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Why the assignment map was re-read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshCause {
    Startup,
    Hint,
    Gap,
    Reconnect,
    Misdirected,
    /// A `503`, connect failure or timeout from an owner: the map may name a dead owner.
    UpstreamError,
    Poll,
}

impl RefreshCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Startup => "startup",
            Self::Hint => "hint",
            Self::Gap => "gap",
            Self::Reconnect => "reconnect",
            Self::Misdirected => "misdirected",
            Self::UpstreamError => "upstream_error",
            Self::Poll => "poll",
        }
    }
}

/// Final outcome of a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardOutcome {
    /// The owner answered 2xx.
    Success,
    /// The owner answered a final 4xx (out of stock, not found, invalid state, ...).
    Rejected,
    /// The owner answered a 5xx the router does not retry (a bug upstream).
    UpstreamError,
    /// Gave up; the request was never applied.
    Unavailable,
    /// Gave up; the request may have been applied.
    OutcomeUnknown,
}

impl ForwardOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Rejected => "rejected",
            Self::UpstreamError => "upstream_error",
            Self::Unavailable => "unavailable",
            Self::OutcomeUnknown => "outcome_unknown",
        }
    }
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Install the global recorder (once per process) and return its handle.
///
/// If another recorder was installed first (not done by this crate), a detached recorder is
/// returned so `/metrics` still works, just without this process's other metrics.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = || {
                PrometheusBuilder::new()
                    .set_buckets_for_metric(
                        Matcher::Full(UPSTREAM_LATENCY_SECONDS.to_owned()),
                        UPSTREAM_LATENCY_BUCKETS,
                    )
                    .and_then(|b| {
                        b.set_buckets_for_metric(
                            Matcher::Full(FORWARD_DURATION_SECONDS.to_owned()),
                            FORWARD_DURATION_BUCKETS,
                        )
                    })
                    .expect("static bucket lists are non-empty")
            };
            let handle = match builder().install_recorder() {
                Ok(handle) => handle,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder already installed; using a detached one");
                    builder().build_recorder().handle()
                }
            };
            describe();
            handle
        })
        .clone()
}

fn describe() {
    describe_counter!(FORWARDS_TOTAL, "forwarded client requests by final outcome");
    describe_counter!(RETRIES_TOTAL, "upstream attempts retried, by cause");
    describe_histogram!(
        UPSTREAM_LATENCY_SECONDS,
        metrics::Unit::Seconds,
        "latency of one upstream attempt"
    );
    describe_histogram!(
        FORWARD_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "time to an upstream answer or giving up, retries included"
    );
    describe_gauge!(ASSIGNMENT_REVISION, "assignment map revision routed by");
    describe_gauge!(
        REDIS_FEED_CONNECTED,
        "1 while the redis hint feed is connected"
    );
    describe_counter!(MAP_REFRESHES_TOTAL, "assignment map re-reads by cause");
    describe_counter!(
        MAP_REFRESH_FAILURES_TOTAL,
        "assignment map re-reads that failed"
    );
    describe_counter!(ORDERS_TOTAL, "multi-line orders by outcome");
    describe_counter!(
        ORDER_LOCKS_LOST_TOTAL,
        "order submissions that lost their order's lock while working, by reason"
    );
    describe_counter!(
        CLIENT_REQUESTS_TOTAL,
        "requests by client and access outcome"
    );
    describe_counter!(AUTH_RELOADS_TOTAL, "auth file reloads by outcome");
    describe_gauge!(AUTH_CLIENTS, "clients in the auth table in force");
    describe_counter!(
        UPSTREAM_AUTH_FAILURES_TOTAL,
        "allocator answers refusing this router's credential"
    );
}

pub fn record_forward(outcome: ForwardOutcome, seconds: f64) {
    counter!(FORWARDS_TOTAL, "outcome" => outcome.as_str()).increment(1);
    histogram!(FORWARD_DURATION_SECONDS).record(seconds);
}

pub fn record_retry(cause: &'static str) {
    counter!(RETRIES_TOTAL, "cause" => cause).increment(1);
}

pub fn record_upstream_latency(seconds: f64) {
    histogram!(UPSTREAM_LATENCY_SECONDS).record(seconds);
}

pub fn set_assignment_revision(revision: i64) {
    gauge!(ASSIGNMENT_REVISION).set(revision as f64);
}

pub fn set_redis_feed_connected(connected: bool) {
    gauge!(REDIS_FEED_CONNECTED).set(if connected { 1.0 } else { 0.0 });
}

pub fn record_map_refresh(cause: RefreshCause) {
    counter!(MAP_REFRESHES_TOTAL, "cause" => cause.as_str()).increment(1);
}

pub fn record_map_refresh_failure(cause: RefreshCause) {
    counter!(MAP_REFRESH_FAILURES_TOTAL, "cause" => cause.as_str()).increment(1);
}

pub fn record_order(outcome: &'static str) {
    counter!(ORDERS_TOTAL, "outcome" => outcome).increment(1);
}

pub fn record_order_lock_lost(reason: &'static str) {
    counter!(ORDER_LOCKS_LOST_TOTAL, "reason" => reason).increment(1);
}

pub fn record_upstream_auth_failure() {
    counter!(UPSTREAM_AUTH_FAILURES_TOTAL).increment(1);
}
