//! Every metric the allocator exports: names, labels and histogram buckets live here only.
//! The names are a contract with `ops/prometheus/alerts.yml` and the Grafana dashboard.
//! The exporter itself (installing the recorder with these buckets, folding buffered histogram
//! samples on a timer) is the one both services run: [`edge::metrics`].

use edge::metrics::Exporter;
use metrics_exporter_prometheus::PrometheusHandle;

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
/// Histogram: seconds a written request spent in each `stage` (`admission`, `queue`, `batch`,
/// `lane`, `statement`, `answer`; see `crate::stages`); the stages tile the request, so their
/// means add up to the mean request latency.
pub const STAGE_DURATION: &str = "allocator_stage_duration_seconds";
/// Group statements the commit lanes may run at once right now: every lane while statements are
/// as quick as on a quiet database, fewer when they slow down measurably (DESIGN.md §6).
pub const COMMIT_CONCURRENCY: &str = "allocator_commit_concurrency";
/// Fenced batch statements by `path`: `set` (the set-based reserve statement wrote the group),
/// `fallback` (it could not decide every reserve and wrote nothing), `function`
/// (`apply_fenced_batch`, after a fallback or for groups that are not plain reserves). A high
/// `fallback` rate means the set-based statement mostly costs a wasted round trip.
pub const BATCH_STATEMENTS: &str = "allocator_batch_statements_total";
pub const EXPIRED_HOLDS: &str = "allocator_expired_holds_total";
pub const LIVE_REPLICAS: &str = "allocator_live_replicas";
/// The partitions the shard this replica serves holds, labelled `shard` (DESIGN.md §12): set
/// once at start, so every series of the replica can be joined to its shard.
pub const SHARD_PARTITIONS: &str = "allocator_shard_partitions";
pub const PROCESS_STALLS: &str = "allocator_process_stalls_total";
pub const QUEUE_REJECTIONS: &str = "allocator_queue_rejections_total";
pub const MISDIRECTED_REQUESTS: &str = "allocator_misdirected_requests_total";
/// Counter: `/readyz`'s database checks by `outcome` (`ok`, `failed`); at most about one a
/// second, however often `/readyz` is called (each result answers it for a second).
pub const READINESS_CHECKS: &str = "allocator_readiness_checks_total";
pub const STALE_ROUTER_REQUESTS: &str = "allocator_stale_router_requests_total";
pub const HINTS_PUBLISHED: &str = "allocator_hints_published_total";
/// Partition workers that ended while they still had authority (a panic): the lease is given up.
pub const WORKER_FAILURES: &str = "allocator_worker_failures_total";
/// Leases released after authority was dropped (stall, deadline, failed worker) while the
/// database still named this replica, so peers and routers need not wait for expiry.
pub const DROPPED_LEASE_RELEASES: &str = "allocator_dropped_lease_releases_total";

/// The names [`access::Gate`] records under (what each counts: [`access::MetricNames`]). On an
/// allocator the `client` label is the authenticated caller, or the client a router named.
pub const ACCESS_METRICS: access::MetricNames = access::MetricNames {
    client_requests: "allocator_client_requests_total",
    auth_reloads: "allocator_auth_reloads_total",
    auth_clients: "allocator_auth_clients",
    quota_refusals: "allocator_quota_refusals_total",
    tls_reloads: "allocator_tls_reloads_total",
    unauthenticated: "allocator_unauthenticated_requests_total",
    audit_suppressed: "allocator_audit_lines_suppressed_total",
};

/// The names the storage fence (DESIGN.md §13) records under (what each counts:
/// [`storage::MetricNames`]).
pub const STORAGE_METRICS: storage::MetricNames = storage::MetricNames {
    refusals: "allocator_storage_refusals_total",
    read_only_connects: "allocator_storage_read_only_connects_total",
    stale_writable_servers: "allocator_storage_stale_writable_servers",
    timeline: "allocator_storage_timeline",
    generation: "allocator_storage_generation",
    replication_lag: "allocator_storage_replication_lag_seconds",
    sync_standbys: "allocator_storage_sync_standbys",
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

/// Latency buckets (seconds) for HTTP requests and database transactions: sub-millisecond to the
/// request deadline.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];
/// Stage buckets (seconds): finer than the request's below a millisecond, where most stages
/// of an unloaded replica fall.
pub const STAGE_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
];
/// Vacancy: a hand-off announced by notification (milliseconds) up to expiry after a crash
/// (about the lease TTL) and longer outages.
const VACANCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
];
/// Batch sizes: 1 (no batching) up to the default maximum of 64.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// The histograms and their buckets; the others are exported as summaries.
const BUCKETS: &[edge::metrics::Buckets] = &[
    (HTTP_REQUEST_DURATION, LATENCY_BUCKETS),
    (DB_TRANSACTION_DURATION, LATENCY_BUCKETS),
    (STAGE_DURATION, STAGE_BUCKETS),
    (BATCH_SIZE, BATCH_BUCKETS),
    (GROUP_PARTITIONS, BATCH_BUCKETS),
    (LEASE_VACANCY, VACANCY_BUCKETS),
];

static EXPORTER: Exporter = Exporter::new(BUCKETS, None);

/// Install the process-wide recorder once (tests build several applications in one process) and
/// return the handle `/metrics` renders from.
pub fn install() -> PrometheusHandle {
    EXPORTER.install()
}
