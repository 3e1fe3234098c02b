//! Command line and environment configuration. Every flag has an environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "allocator",
    version,
    about = "Fenced inventory allocator replica"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the schema and fix the partition count (idempotent).
    Migrate(MigrateArgs),
    /// Run an allocator replica.
    Serve(Box<ServeConfig>),
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// Partition count for a new cluster (default 64); must match an existing cluster's.
    #[arg(long, env = "ALLOCATOR_PARTITIONS")]
    pub partitions: Option<u32>,
}

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    #[arg(long, env = "ALLOCATOR_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Unique, stable name of this replica; a restart under the same id may re-take its leases
    /// at once (with new epochs).
    #[arg(long, env = "ALLOCATOR_REPLICA_ID")]
    pub replica_id: String,
    /// URL routers use to reach this replica; stored on every lease it holds. Defaults to
    /// `http://<bound listen address>`.
    #[arg(long, env = "ALLOCATOR_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// Redis for assignment change hints; optional, never an authority.
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,

    /// Lease duration granted by the database.
    #[arg(long, env = "ALLOCATOR_LEASE_TTL_MS", default_value_t = 5000)]
    pub lease_ttl_ms: u64,
    /// Renewal period; default ttl / 3.
    #[arg(long, env = "ALLOCATOR_RENEW_INTERVAL_MS")]
    pub renew_interval_ms: Option<u64>,
    /// Safety margin subtracted from the lease for the local deadline; also the stall budget.
    #[arg(long, env = "ALLOCATOR_LEASE_MARGIN_MS", default_value_t = 1000)]
    pub lease_margin_ms: u64,
    /// Mean time between campaigns (±20 % jitter).
    #[arg(long, env = "ALLOCATOR_CAMPAIGN_INTERVAL_MS", default_value_t = 1000)]
    pub campaign_interval_ms: u64,

    /// Connections for request transactions.
    #[arg(long, env = "ALLOCATOR_POOL_SIZE", default_value_t = 16)]
    pub pool_size: usize,
    /// Longest wait for a pooled connection before answering 503.
    #[arg(long, env = "ALLOCATOR_POOL_WAIT_MS", default_value_t = 2000)]
    pub pool_wait_ms: u64,
    /// Server-side statement timeout on every connection.
    #[arg(long, env = "ALLOCATOR_STATEMENT_TIMEOUT_MS", default_value_t = 3000)]
    pub statement_timeout_ms: u64,
    /// Server-side idle-in-transaction timeout: bounds how long a paused replica keeps the lease
    /// row share-locked and so how long it can delay a takeover.
    #[arg(long, env = "ALLOCATOR_IDLE_IN_TX_TIMEOUT_MS", default_value_t = 2000)]
    pub idle_in_transaction_timeout_ms: u64,

    /// Longest wait for a row lock inside a fenced transaction. Only an abnormal writer (an
    /// operator's session, a paused old owner) ever holds a row this replica needs, so a short
    /// wait turns it into a quick `503` for that partition instead of a stalled queue.
    #[arg(long, env = "ALLOCATOR_LOCK_TIMEOUT_MS", default_value_t = 500)]
    pub lock_timeout_ms: u64,
    /// Concurrent group-commit transactions (each uses one pooled connection while it runs).
    /// Default: the number of CPUs, at most the pool size. Fewer lanes make larger groups, and
    /// every batch statement has a fixed cost that a larger group shares; more lanes than cores
    /// only add contention.
    #[arg(long, env = "ALLOCATOR_COMMIT_LANES")]
    pub commit_lanes: Option<usize>,
    /// Most partitions whose ready batches share one transaction; 1 turns group commit off.
    #[arg(long, env = "ALLOCATOR_GROUP_MAX_PARTITIONS", default_value_t = 32)]
    pub group_max_partitions: usize,

    /// Most commands one partition transaction may carry.
    #[arg(long, env = "ALLOCATOR_BATCH_MAX", default_value_t = 64)]
    pub batch_max: usize,
    /// Queued commands per partition before new ones get 503.
    #[arg(long, env = "ALLOCATOR_QUEUE_CAPACITY", default_value_t = 4096)]
    pub queue_capacity: usize,
    /// Deadline for one request inside the replica.
    #[arg(long, env = "ALLOCATOR_REQUEST_TIMEOUT_MS", default_value_t = 5000)]
    pub request_timeout_ms: u64,
    /// How often each owned partition sweeps overdue holds.
    #[arg(long, env = "ALLOCATOR_EXPIRY_INTERVAL_MS", default_value_t = 1000)]
    pub expiry_interval_ms: u64,
    /// Most holds expired per sweep transaction.
    #[arg(long, env = "ALLOCATOR_EXPIRY_BATCH", default_value_t = 100)]
    pub expiry_batch: i64,
    /// HTTP worker threads.
    #[arg(long, env = "ALLOCATOR_HTTP_WORKERS", default_value_t = 2)]
    pub http_workers: usize,
    /// Length of one settlement window (the singleton settlement job).
    #[arg(long, env = "ALLOCATOR_SETTLEMENT_WINDOW_SECS", default_value_t = 60)]
    pub settlement_window_secs: u64,
    /// How long after a window's end it may be settled; must exceed the statement timeout,
    /// because a confirmation may commit that long after its timestamp. Default: statement
    /// timeout + 2 s.
    #[arg(long, env = "ALLOCATOR_SETTLEMENT_GRACE_MS")]
    pub settlement_grace_ms: Option<u64>,
}

impl ServeConfig {
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }
    pub fn lease_margin(&self) -> Duration {
        Duration::from_millis(self.lease_margin_ms)
    }
    pub fn renew_interval(&self) -> Duration {
        Duration::from_millis(self.renew_interval_ms.unwrap_or(self.lease_ttl_ms / 3))
    }
    pub fn commit_lanes(&self) -> usize {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        self.commit_lanes.unwrap_or(cpus.min(self.pool_size)).max(1)
    }
    pub fn campaign_interval(&self) -> Duration {
        Duration::from_millis(self.campaign_interval_ms)
    }
    pub fn settlement_window(&self) -> Duration {
        Duration::from_secs(self.settlement_window_secs)
    }
    pub fn settlement_grace(&self) -> Duration {
        Duration::from_millis(
            self.settlement_grace_ms
                .unwrap_or(self.statement_timeout_ms + 2000),
        )
    }

    /// Defaults for tests and embedding: everything but the identity and database.
    pub fn for_tests(database_url: &str, replica_id: &str) -> Self {
        let cli = Cli::try_parse_from([
            "allocator",
            "serve",
            "--database-url",
            database_url,
            "--listen",
            "127.0.0.1:0",
            "--replica-id",
            replica_id,
        ])
        .expect("static arguments parse");
        match cli.command {
            Command::Serve(config) => *config,
            Command::Migrate(_) => unreachable!(),
        }
    }
}
