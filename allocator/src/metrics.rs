//! Every metric the allocator exports: names, labels and histogram buckets live here only.
//! The names are a contract with `ops/prometheus/alerts.yml` and the Grafana dashboard.
//!
//! The exporter buffers every histogram sample until something folds the buffers into their
//! buckets; without its HTTP listener (default features off) only a render or an explicit
//! upkeep does that. A replica nobody scrapes would therefore grow without bound, so
//! [`run_upkeep`] folds them on a timer of its own, independent of scrapes.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

pub const LEASES_HELD: &str = "allocator_leases_held";
pub const LEASE_REMAINING_SECONDS: &str = "allocator_lease_remaining_seconds";
pub const LEASE_ACQUISITIONS: &str = "allocator_lease_acquisitions_total";
pub const LEASE_RENEW_FAILURES: &str = "allocator_lease_renew_failures_total";
pub const LEASE_LOSSES: &str = "allocator_lease_losses_total";
pub const LEASE_RELEASES: &str = "allocator_lease_releases_total";
pub const PARTITION_EPOCH: &str = "allocator_partition_epoch";
pub const STALE_EPOCH_REJECTIONS: &str = "allocator_stale_epoch_rejections_total";
pub const RESERVATION_OUTCOMES: &str = "allocator_reservation_outcomes_total";
pub const HTTP_REQUEST_DURATION: &str = "allocator_http_request_duration_seconds";
pub const BATCH_SIZE: &str = "allocator_batch_size";
/// Partitions whose batches shared one transaction (group commit).
pub const GROUP_PARTITIONS: &str = "allocator_group_partitions";
/// Queued commands dropped because their caller had already given up.
pub const ABANDONED_COMMANDS: &str = "allocator_abandoned_commands_total";
pub const DB_TRANSACTION_DURATION: &str = "allocator_db_transaction_duration_seconds";
/// Group statements the commit lanes may run at once right now: it rises while statements stay
/// quick and batches wait, and falls when the database slows down (DESIGN.md §6).
pub const COMMIT_CONCURRENCY: &str = "allocator_commit_concurrency";
/// Fenced batch statements by `path`: `set` (the set-based reserve statement wrote the group),
/// `fallback` (it could not decide every reserve and wrote nothing), `function`
/// (`apply_fenced_batch`, after a fallback or for groups that are not plain reserves). A high
/// `fallback` rate means the set-based statement mostly costs a wasted round trip.
pub const BATCH_STATEMENTS: &str = "allocator_batch_statements_total";
pub const EXPIRED_HOLDS: &str = "allocator_expired_holds_total";
pub const LIVE_REPLICAS: &str = "allocator_live_replicas";
pub const PROCESS_STALLS: &str = "allocator_process_stalls_total";
pub const QUEUE_REJECTIONS: &str = "allocator_queue_rejections_total";
pub const MISDIRECTED_REQUESTS: &str = "allocator_misdirected_requests_total";
pub const STALE_ROUTER_REQUESTS: &str = "allocator_stale_router_requests_total";
pub const HINTS_PUBLISHED: &str = "allocator_hints_published_total";
/// Partition workers that ended while they still had authority (a panic): the lease is given up.
pub const WORKER_FAILURES: &str = "allocator_worker_failures_total";
/// Leases released after authority was dropped (stall, deadline, failed worker) while the
/// database still named this replica, so peers and routers need not wait for expiry.
pub const DROPPED_LEASE_RELEASES: &str = "allocator_dropped_lease_releases_total";

/// Requests by `client` (the authenticated caller, or the client a router named; `anonymous`
/// with authentication off, `(none)` when no valid token was shown) and `outcome`: `ok`,
/// `unauthenticated`, `forbidden`, `namespace_forbidden`, `rate_limited`, `concurrency_limited`,
/// `quota_exceeded`. Client names come from auth files, so the label stays as small as they are.
pub const CLIENT_REQUESTS: &str = "allocator_client_requests_total";
/// Auth file reloads (SIGHUP) by `outcome`: `ok`, `failed` (the previous table stays).
pub const AUTH_RELOADS: &str = "allocator_auth_reloads_total";
/// Clients in the auth table in force.
pub const AUTH_CLIENTS: &str = "allocator_auth_clients";

/// Requests refused by a quota of the client's auth-file line, by `client` and `quota`
/// (`max_quantity`; `max_held_per_sku` and `max_held_units` once the fenced batch decides them).
pub const QUOTA_REFUSALS: &str = "allocator_quota_refusals_total";

/// TLS certificate, key and CA reloads (SIGHUP) by `outcome`: `ok`, `failed` (the material in
/// force stays).
pub const TLS_RELOADS: &str = "allocator_tls_reloads_total";

/// The names [`access::Gate`] records under.
pub const ACCESS_METRICS: access::MetricNames = access::MetricNames {
    client_requests: CLIENT_REQUESTS,
    auth_reloads: AUTH_RELOADS,
    auth_clients: AUTH_CLIENTS,
    quota_refusals: QUOTA_REFUSALS,
    tls_reloads: TLS_RELOADS,
};

// Storage fence (DESIGN.md §13), recorded by the `storage` crate under these names.
/// Connection attempts that reached a server the fence refused, by `cause`: `behind` (an old
/// primary superseded by a promotion), `foreign` (another cluster, e.g. a restored copy),
/// `not_serving` (a copy being restored).
pub const STORAGE_REFUSALS: &str = "allocator_storage_refusals_total";
/// Connection attempts that reached a read-only server (a standby) while looking for the primary.
pub const STORAGE_READ_ONLY_CONNECTS: &str = "allocator_storage_read_only_connects_total";
/// Configured servers that accept writes but are behind the newest primary: a revived old
/// primary. Above 0 the HA manager failed to fence it.
pub const STORAGE_STALE_WRITABLE_SERVERS: &str = "allocator_storage_stale_writable_servers";
/// The newest WAL timeline and generation this process knows.
pub const STORAGE_TIMELINE: &str = "allocator_storage_timeline";
pub const STORAGE_GENERATION: &str = "allocator_storage_generation";
/// The primary's largest standby replay lag, seconds (`pg_stat_replication.replay_lag`).
pub const STORAGE_REPLICATION_LAG: &str = "allocator_storage_replication_lag_seconds";
/// The primary's synchronous standbys; 0 means an acknowledged commit may exist on the primary
/// alone.
pub const STORAGE_SYNC_STANDBYS: &str = "allocator_storage_sync_standbys";

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

/// Seconds a partition had no live owner before it was acquired (database clock): after a planned
/// hand-off milliseconds, after a crash about one lease TTL.
pub const LEASE_VACANCY: &str = "allocator_lease_vacancy_seconds";

// Singleton jobs, labelled `job` (`settlement`, `retention`).
/// 1 on the replica that holds the job's lease with authority, 0 elsewhere.
pub const JOB_LEADER: &str = "allocator_job_leader";
/// The term (lease epoch) this replica last held the job under.
pub const JOB_TERM: &str = "allocator_job_term";
/// Job steps by `outcome`: `settled`, `taken_over`, `removed`, `archived`, `stale_term`,
/// `failed`.
pub const JOB_RUNS: &str = "allocator_job_runs_total";
/// Seconds from the end of the last settled window to now (database clock), on every replica.
pub const JOB_WINDOW_LAG: &str = "allocator_job_window_lag_seconds";
/// The configured window length, so alerts can compare the lag with it.
pub const JOB_WINDOW_SECONDS: &str = "allocator_job_window_seconds";
/// Writes of an older term that the database refused (a paused or cut-off former holder).
pub const JOB_STALE_TERM_REJECTIONS: &str = "allocator_job_stale_term_rejections_total";

// The change-event relay (DESIGN.md §14), exported by the replica that runs it.
/// Ledger rows and settled windows committed but not yet acknowledged by Redis, all streams.
pub const EVENTS_LAG_ENTRIES: &str = "allocator_events_relay_lag_entries";
/// Age (database clock) of the oldest entry the relay had yet to publish when it last looked;
/// 0 when it was caught up.
pub const EVENTS_LAG_SECONDS: &str = "allocator_events_relay_lag_seconds";
/// Entries appended to Redis streams, by `stream` kind (`partition`, `settlement`); a
/// republish after a Redis restart counts again.
pub const EVENTS_PUBLISHED: &str = "allocator_events_published_total";
/// Streams found missing or behind in Redis (a restart without persistence) and republished
/// from the database.
pub const EVENTS_REPUBLISHES: &str = "allocator_events_republishes_total";
/// Relay rounds that failed, by `cause` (`redis`, `database`, `stale_term`).
pub const EVENTS_RELAY_FAILURES: &str = "allocator_events_relay_failures_total";
// Retention and table health (the retention job; health is read on every replica).
/// Rows removed past the idempotency horizon, by `table` (`reservations`, `orders`).
pub const RETENTION_REMOVED: &str = "allocator_retention_removed_total";
/// The configured idempotency horizon.
pub const RETENTION_HORIZON_SECONDS: &str = "allocator_retention_horizon_seconds";
/// Ledger time partitions attached now (V17).
pub const LEDGER_PARTITIONS: &str = "allocator_ledger_partitions";
/// How far past now (database clock) the last ledger partition ends; a ledger row stamped later
/// cannot be written. Every replica keeps it at three spans or more.
pub const LEDGER_PARTITIONS_AHEAD_SECONDS: &str = "allocator_ledger_partitions_ahead_seconds";
/// The span of the ledger partitions being created.
pub const LEDGER_PARTITION_SPAN_SECONDS: &str = "allocator_ledger_partition_span_seconds";
/// Ledger partitions the retention job archived (exported, detached, dropped).
pub const LEDGER_ARCHIVED_PARTITIONS: &str = "allocator_ledger_archived_partitions_total";
/// Ledger rows in the partitions the retention job archived.
pub const LEDGER_ARCHIVED_ROWS: &str = "allocator_ledger_archived_rows_total";
/// Size on disk of a watched table with its indexes and TOAST, by `table`.
pub const TABLE_BYTES: &str = "allocator_table_bytes";
/// `pg_stat_user_tables.n_live_tup`, by `table`.
pub const TABLE_LIVE_TUPLES: &str = "allocator_table_live_tuples";
/// `pg_stat_user_tables.n_dead_tup`, by `table`: what vacuum has not reclaimed yet.
pub const TABLE_DEAD_TUPLES: &str = "allocator_table_dead_tuples";
/// `pg_stat_user_tables.n_tup_upd` (a counter kept by the server), by `table`.
pub const TABLE_UPDATES: &str = "allocator_table_updates";
/// `pg_stat_user_tables.n_tup_hot_upd`, by `table`; divided by the updates, the HOT ratio.
pub const TABLE_HOT_UPDATES: &str = "allocator_table_hot_updates";

/// How often histogram samples are folded into their buckets. Bounds the buffered samples to
/// what arrives in this period (about 0.5 MB at 1.3k requests/s), scraped or not.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Latency buckets (seconds) for HTTP requests and database transactions: sub-millisecond to the
/// request deadline.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];
/// Vacancy: a hand-off announced by notification (milliseconds) up to expiry after a crash
/// (about the lease TTL) and longer outages.
const VACANCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
];
/// Batch sizes: 1 (no batching) up to the default maximum of 64.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Install the process-wide recorder once (tests build several applications in one process) and
/// return the handle `/metrics` renders from.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(HTTP_REQUEST_DURATION.to_owned()),
                    LATENCY_BUCKETS,
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(DB_TRANSACTION_DURATION.to_owned()),
                        LATENCY_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(BATCH_SIZE.to_owned()), BATCH_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(GROUP_PARTITIONS.to_owned()),
                        BATCH_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(LEASE_VACANCY.to_owned()),
                        VACANCY_BUCKETS,
                    )
                })
                .expect("static, non-empty bucket lists");
            match builder.install_recorder() {
                Ok(handle) => handle,
                // Another recorder (e.g. the router's, in a shared test process) is installed;
                // keep a private one so rendering still works.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

/// Fold buffered histogram samples every [`UPKEEP_INTERVAL`] until `shutdown` fires.
pub async fn run_upkeep(handle: PrometheusHandle, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => handle.run_upkeep(),
        }
    }
}
