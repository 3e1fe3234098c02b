//! The serve command's flags with the environment variables that set them, named in refusals.

/// A flag and the environment variable that sets it, for error messages.
pub(super) struct Flag {
    flag: &'static str,
    env: &'static str,
}

impl std::fmt::Display for Flag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "--{} ({})", self.flag, self.env)
    }
}

const fn flag(flag: &'static str, env: &'static str) -> Flag {
    Flag { flag, env }
}

pub(super) const LEASE_TTL: Flag = flag("lease-ttl-ms", "ALLOCATOR_LEASE_TTL_MS");
pub(super) const RENEW_INTERVAL: Flag = flag("renew-interval-ms", "ALLOCATOR_RENEW_INTERVAL_MS");
pub(super) const LEASE_MARGIN: Flag = flag("lease-margin-ms", "ALLOCATOR_LEASE_MARGIN_MS");
pub(super) const CAMPAIGN_INTERVAL: Flag =
    flag("campaign-interval-ms", "ALLOCATOR_CAMPAIGN_INTERVAL_MS");
pub(super) const POOL_SIZE: Flag = flag("pool-size", "ALLOCATOR_POOL_SIZE");
pub(super) const POOL_WAIT: Flag = flag("pool-wait-ms", "ALLOCATOR_POOL_WAIT_MS");
pub(super) const STATEMENT_TIMEOUT: Flag =
    flag("statement-timeout-ms", "ALLOCATOR_STATEMENT_TIMEOUT_MS");
pub(super) const IDLE_IN_TX_TIMEOUT: Flag = flag(
    "idle-in-transaction-timeout-ms",
    "ALLOCATOR_IDLE_IN_TX_TIMEOUT_MS",
);
pub(super) const LOCK_TIMEOUT: Flag = flag("lock-timeout-ms", "ALLOCATOR_LOCK_TIMEOUT_MS");
pub(super) const COMMIT_LANES: Flag = flag("commit-lanes", "ALLOCATOR_COMMIT_LANES");
pub(super) const GROUP_MAX_PARTITIONS: Flag =
    flag("group-max-partitions", "ALLOCATOR_GROUP_MAX_PARTITIONS");
pub(super) const BATCH_MAX: Flag = flag("batch-max", "ALLOCATOR_BATCH_MAX");
pub(super) const QUEUE_CAPACITY: Flag = flag("queue-capacity", "ALLOCATOR_QUEUE_CAPACITY");
pub(super) const REQUEST_TIMEOUT: Flag = flag("request-timeout-ms", "ALLOCATOR_REQUEST_TIMEOUT_MS");
pub(super) const EXPIRY_INTERVAL: Flag = flag("expiry-interval-ms", "ALLOCATOR_EXPIRY_INTERVAL_MS");
pub(super) const EXPIRY_BATCH: Flag = flag("expiry-batch", "ALLOCATOR_EXPIRY_BATCH");
pub(super) const HTTP_WORKERS: Flag = flag("http-workers", "ALLOCATOR_HTTP_WORKERS");
pub(super) const REPLICA_ID: Flag = flag("replica-id", "ALLOCATOR_REPLICA_ID");
pub(super) const SETTLEMENT_WINDOW: Flag =
    flag("settlement-window-secs", "ALLOCATOR_SETTLEMENT_WINDOW_SECS");
pub(super) const SETTLEMENT_GRACE: Flag =
    flag("settlement-grace-ms", "ALLOCATOR_SETTLEMENT_GRACE_MS");
pub(super) const IDEMPOTENCY_HORIZON: Flag = flag(
    "idempotency-horizon-secs",
    "ALLOCATOR_IDEMPOTENCY_HORIZON_SECS",
);
pub(super) const RETENTION_BATCH: Flag = flag("retention-batch", "ALLOCATOR_RETENTION_BATCH");
pub(super) const CLIENT_CONCURRENCY: Flag =
    flag("client-concurrency", "ALLOCATOR_CLIENT_CONCURRENCY");
