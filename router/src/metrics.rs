//! Every metric the router exports: names, label values and histogram buckets in one place,
//! because they are a contract with the dashboards and alert rules in `ops/` (DESIGN.md §10).
//!
//! The Prometheus recorder is process-global; [`install`] installs it once and hands out the
//! same handle on later calls, so several in-process routers (tests) share one registry.
//! `/metrics` renders that handle. The exporter itself is the one both services run:
//! [`edge::metrics`].

use edge::metrics::Exporter;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::PrometheusHandle;

/// Forwarded client requests by final outcome (one per client request, not per attempt).
/// `outcome`: see [`ForwardOutcome`].
pub const FORWARDS_TOTAL: &str = "router_forwards_total";
/// Upstream attempts that were retried. `cause`: see [`crate::retry::RetryCause`].
pub const RETRIES_TOTAL: &str = "router_retries_total";
/// Latency of one upstream attempt (connect to full response), including failed attempts.
pub const UPSTREAM_LATENCY_SECONDS: &str = "router_upstream_latency_seconds";
/// Time from receiving a request to having an upstream answer or giving up, retries included.
/// Histogram: seconds a forwarded request spent in each `stage` (`accept`, `map`, `connect`,
/// `upstream`, `retry`, `reply`; see `crate::forward::stages`); the stages tile the request.
pub const STAGE_DURATION_SECONDS: &str = "router_stage_duration_seconds";
pub const FORWARD_DURATION_SECONDS: &str = "router_forward_duration_seconds";
/// Revision of the assignment map the router routes by: with several shards the highest over
/// them (revisions of two shards are not comparable; [`SHARD_ASSIGNMENT_REVISION`] is exact).
pub const ASSIGNMENT_REVISION: &str = "router_assignment_revision";
/// Revision of each shard's assignment map the router routes by, by `shard`.
pub const SHARD_ASSIGNMENT_REVISION: &str = "router_shard_assignment_revision";
/// Failed reads of one shard's assignment map, or of the catalog's shard map, by `shard`.
pub const SHARD_MAP_READ_FAILURES_TOTAL: &str = "router_shard_map_read_failures_total";
/// 1 while the catalog's shard map has been read and names the configured shards; 0 while the
/// router refuses to route by it (not ready).
pub const SHARD_MAP_AGREES: &str = "router_shard_map_agrees";
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

/// Each shard's settlement lag, by `shard`: seconds from the end of its last settled window (or
/// the cluster's creation) to now by that shard's clock, read once per poll interval. Healthy
/// values stay below two windows plus the closing grace; a shard whose read failed keeps its
/// last value (see [`SETTLEMENT_READ_FAILURES_TOTAL`]).
pub const SETTLEMENT_LAG_SECONDS: &str = "router_settlement_lag_seconds";
/// Failed reads of a shard's settlement lag, by `shard`.
pub const SETTLEMENT_READ_FAILURES_TOTAL: &str = "router_settlement_read_failures_total";

/// Answers of allocators that refused this router's own credential (`401`/`403`): a
/// misconfigured `--upstream-token-file` or allocator auth file.
pub const UPSTREAM_AUTH_FAILURES_TOTAL: &str = "router_upstream_auth_failures_total";
/// Counter: upstream attempts not sent because the owner advertises a plain `http://` URL while
/// this router reaches allocators over TLS only (`--upstream-ca`).
pub const UPSTREAM_PLAIN_REFUSALS_TOTAL: &str = "router_upstream_plain_refusals_total";

/// The names [`access::Gate`] records under (what each counts: [`access::MetricNames`]).
pub const ACCESS_METRICS: access::MetricNames = access::MetricNames {
    client_requests: "router_client_requests_total",
    auth_reloads: "router_auth_reloads_total",
    auth_clients: "router_auth_clients",
    quota_refusals: "router_quota_refusals_total",
    tls_reloads: "router_tls_reloads_total",
    unauthenticated: "router_unauthenticated_requests_total",
    audit_suppressed: "router_audit_lines_suppressed_total",
};

/// The names the storage fence (DESIGN.md §13) records under (what each counts:
/// [`storage::MetricNames`]). The router keeps a fence per shard, so every one of these series carries
/// `shard` ([`crate::db::fence`]).
pub const STORAGE_METRICS: storage::MetricNames = storage::MetricNames {
    refusals: "router_storage_refusals_total",
    read_only_connects: "router_storage_read_only_connects_total",
    stale_writable_servers: "router_storage_stale_writable_servers",
    timeline: "router_storage_timeline",
    generation: "router_storage_generation",
    replication_lag: "router_storage_replication_lag_seconds",
    sync_standbys: "router_storage_sync_standbys",
};

/// Buckets for upstream latency: sub-millisecond local hops up to the 5 s retry deadline.
pub const UPSTREAM_LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Buckets for the whole forward: retries push it to the deadline, so the tail reaches 10 s.
pub const FORWARD_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets for the stages: most are well under a millisecond, the upstream call a few.
pub const STAGE_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
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
    /// The outcome of giving up: unknown once an attempt may have been applied, unavailable
    /// while none can have been.
    pub fn gave_up(maybe_applied: bool) -> ForwardOutcome {
        if maybe_applied {
            Self::OutcomeUnknown
        } else {
            Self::Unavailable
        }
    }

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

/// The histograms and their buckets; the others are exported as summaries.
const BUCKETS: &[edge::metrics::Buckets] = &[
    (UPSTREAM_LATENCY_SECONDS, UPSTREAM_LATENCY_BUCKETS),
    (FORWARD_DURATION_SECONDS, FORWARD_DURATION_BUCKETS),
    (STAGE_DURATION_SECONDS, STAGE_BUCKETS),
];

static EXPORTER: Exporter = Exporter::new(BUCKETS, Some(describe));

/// Install the global recorder (once per process; see [`Exporter::install`]) and return its
/// handle.
pub fn install() -> PrometheusHandle {
    EXPORTER.install()
}

fn describe() {
    describe_counter!(FORWARDS_TOTAL, "forwarded client requests by final outcome");
    describe_counter!(RETRIES_TOTAL, "upstream attempts retried, by cause");
    describe_histogram!(
        STAGE_DURATION_SECONDS,
        "seconds a forwarded request spent in each stage; the stages tile the request"
    );
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
        SHARD_ASSIGNMENT_REVISION,
        "assignment map revision routed by, per shard"
    );
    describe_counter!(
        SHARD_MAP_READ_FAILURES_TOTAL,
        "failed reads of a shard's assignment map or of the catalog's shard map, per shard"
    );
    describe_gauge!(
        SHARD_MAP_AGREES,
        "1 while the catalog's shard map agrees with the configured shards"
    );
    describe_gauge!(
        SETTLEMENT_LAG_SECONDS,
        metrics::Unit::Seconds,
        "seconds since the end of the last settled window, per shard"
    );
    describe_counter!(
        SETTLEMENT_READ_FAILURES_TOTAL,
        "failed reads of a shard's settlement lag, per shard"
    );
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
        ACCESS_METRICS.client_requests,
        "requests by client and access outcome"
    );
    describe_counter!(ACCESS_METRICS.auth_reloads, "auth file reloads by outcome");
    describe_gauge!(
        ACCESS_METRICS.auth_clients,
        "clients in the auth table in force"
    );
    describe_counter!(
        ACCESS_METRICS.unauthenticated,
        "requests refused 401 (no, a malformed or an unknown token), by reason"
    );
    describe_counter!(
        ACCESS_METRICS.audit_suppressed,
        "audit lines of unauthenticated refusals left out over the per-second cap"
    );
    describe_counter!(
        UPSTREAM_AUTH_FAILURES_TOTAL,
        "allocator answers refusing this router's credential"
    );
    describe_counter!(
        UPSTREAM_PLAIN_REFUSALS_TOTAL,
        "upstream attempts not sent: a plain http owner while upstream TLS is configured"
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

pub fn set_shard_assignment_revision(shard: &str, revision: i64) {
    gauge!(SHARD_ASSIGNMENT_REVISION, "shard" => shard.to_owned()).set(revision as f64);
}

pub fn record_shard_map_read_failure(shard: &str) {
    counter!(SHARD_MAP_READ_FAILURES_TOTAL, "shard" => shard.to_owned()).increment(1);
}

pub fn set_shard_map_agrees(agrees: bool) {
    gauge!(SHARD_MAP_AGREES).set(if agrees { 1.0 } else { 0.0 });
}

pub fn set_settlement_lag(shard: &str, seconds: f64) {
    gauge!(SETTLEMENT_LAG_SECONDS, "shard" => shard.to_owned()).set(seconds);
}

pub fn record_settlement_read_failure(shard: &str) {
    counter!(SETTLEMENT_READ_FAILURES_TOTAL, "shard" => shard.to_owned()).increment(1);
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

pub fn record_plain_owner_refusal() {
    counter!(UPSTREAM_PLAIN_REFUSALS_TOTAL).increment(1);
}
