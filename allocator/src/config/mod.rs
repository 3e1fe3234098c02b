//! Command line and runtime configuration.
//!
//! Every flag can also be set from the environment (`env` on every argument), because replicas
//! run under orchestrators that configure through the environment. [`ServeArgs`] is the raw
//! command line; [`AllocatorConfig`] is the validated runtime form with [`Duration`]s and non-zero
//! counts. A value that cannot work (a zero pool, a renewal slower than the lease it renews) is
//! refused at start with the flag and the environment variable named, never silently adjusted:
//! an operator who typed `0` should learn that it is wrong, not run with something else.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};

use crate::lease::state::{MIN_RENEW_ATTEMPT, RENEW_ATTEMPTS};
/// The `migrate` command's arguments, kept with the command (`crate::shard`).
pub use crate::shard::MigrateArgs;

mod flags;
use flags::*;
pub use flags::{ACCESS_FLAGS, TLS_CERT_FLAG, TLS_CLIENT_CA_FLAG, TLS_KEY_FLAG};

/// Shortest hold-expiry sweep period: sweeping more often only spends transactions.
pub const EXPIRY_INTERVAL_MIN: Duration = Duration::from_millis(10);

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
    Migrate(crate::shard::MigrateArgs),
    /// Run an allocator replica.
    Serve(Box<ServeArgs>),
    /// Archive or restore the ledger's time partitions.
    Ledger(crate::retention::command::LedgerArgs),
    /// Operate on the shards: move a partition to another shard.
    Shards(crate::shard::ShardsArgs),
}

/// The `serve` command line as typed; [`AllocatorConfig::try_from`] validates it.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The primary of the shard this replica serves (of the cluster's one database by default).
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// The catalog database, which holds the shard map; needed when `--database-url` is a shard
    /// other than the catalog. The replica refuses to start when the map disagrees with the
    /// partitions its shard holds.
    #[arg(long, env = "ALLOCATOR_CATALOG_URL")]
    pub catalog_url: Option<String>,
    /// A file, on storage that outlives the process, where the storage fence keeps the newest
    /// primary seen: a restart while only a superseded old primary answers refuses it
    /// (DESIGN.md §13). Remove it only to point the replica at another cluster on purpose.
    #[arg(long, env = "ALLOCATOR_FENCE_MEMORY")]
    pub fence_memory: Option<PathBuf>,
    /// Every shard of a cluster over several, as `NAME=URL` (as for `allocator migrate`; in
    /// `ALLOCATOR_SHARDS` separated by spaces): retention then removes an order only once its
    /// lines are gone on every shard. Without it an order stored here waits for its lines here.
    #[arg(
        long = "shard",
        env = "ALLOCATOR_SHARDS",
        value_name = "NAME=URL",
        value_delimiter = ' '
    )]
    pub shards: Vec<schema::shard::ShardTarget>,
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
    /// Renewal period; default ttl / 3. What it leaves of ttl - margin is shared by three
    /// renewal attempts (two may fail, the third still lands in time): at least 3 x 20 ms.
    #[arg(long, env = "ALLOCATOR_RENEW_INTERVAL_MS")]
    pub renew_interval_ms: Option<u64>,
    /// Safety margin subtracted from the lease for the local deadline; also the stall budget.
    /// Must be shorter than the ttl.
    #[arg(long, env = "ALLOCATOR_LEASE_MARGIN_MS", default_value_t = 1000)]
    pub lease_margin_ms: u64,
    /// Mean time between campaigns (±20 % jitter).
    #[arg(long, env = "ALLOCATOR_CAMPAIGN_INTERVAL_MS", default_value_t = 1000)]
    pub campaign_interval_ms: u64,
    /// Keep a `LISTEN` session so a peer's announced release or departure starts a campaign at
    /// once (planned hand-off in milliseconds). Turn off where a database endpoint does not
    /// allow `LISTEN`; peers then pick released partitions up at their next campaign.
    #[arg(long, env = "ALLOCATOR_HANDOFF_LISTEN", default_value_t = true, action = clap::ArgAction::Set)]
    pub handoff_listen: bool,

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
    /// Most concurrent group-commit transactions (each uses one pooled connection while it runs).
    /// How many run adapts to the load, from the number of CPUs up to this: more while
    /// statements stay quick and batches wait, fewer (so larger groups share each statement's
    /// fixed cost) when the database slows down. Default: half the pool size.
    #[arg(long, env = "ALLOCATOR_COMMIT_LANES")]
    pub commit_lanes: Option<usize>,
    /// Most partitions whose ready batches share one transaction; 1 turns group commit off.
    #[arg(long, env = "ALLOCATOR_GROUP_MAX_PARTITIONS", default_value_t = 32)]
    pub group_max_partitions: usize,

    /// Write groups of plain reserves (new ids, enough stock) with one set-based statement
    /// instead of the procedural batch function; `false` sends every group through the function.
    #[arg(long, env = "ALLOCATOR_SET_BASED_RESERVES", default_value_t = true, action = clap::ArgAction::Set)]
    pub set_based_reserves: bool,

    /// Most commands one partition transaction may carry.
    #[arg(long, env = "ALLOCATOR_BATCH_MAX", default_value_t = 64)]
    pub batch_max: usize,
    /// Queued commands per partition before new ones get 503.
    #[arg(long, env = "ALLOCATOR_QUEUE_CAPACITY", default_value_t = 4096)]
    pub queue_capacity: usize,
    /// Deadline for one request inside the replica.
    #[arg(long, env = "ALLOCATOR_REQUEST_TIMEOUT_MS", default_value_t = 5000)]
    pub request_timeout_ms: u64,
    /// How often each owned partition sweeps overdue holds (at least 10 ms).
    #[arg(long, env = "ALLOCATOR_EXPIRY_INTERVAL_MS", default_value_t = 1000)]
    pub expiry_interval_ms: u64,
    /// Most holds expired per sweep transaction.
    #[arg(long, env = "ALLOCATOR_EXPIRY_BATCH", default_value_t = 100)]
    pub expiry_batch: u32,
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
    /// The change-event relay's flags (`--events`, …).
    #[command(flatten)]
    pub events: crate::events::EventsArgs,
    /// How long after its last transition a terminal reservation (and a finished order) still
    /// replays; then the retention job removes it and a reuse of its id is a new request.
    /// Default: 7 days, longer than any client's retry window.
    #[arg(
        long,
        env = "ALLOCATOR_IDEMPOTENCY_HORIZON_SECS",
        default_value_t = 604_800
    )]
    pub idempotency_horizon_secs: u64,
    /// Most rows one retention statement removes (each is a short transaction of its own).
    #[arg(long, env = "ALLOCATOR_RETENTION_BATCH", default_value_t = 500)]
    pub retention_batch: usize,
    /// Archive the ledger's oldest time partition into this directory (a CSV file and its
    /// SHA-256) and drop it once it is past the horizon, settled and relayed; the retention job
    /// does it. Without it nothing is archived (`allocator ledger archive` does it by hand).
    #[arg(long, env = "ALLOCATOR_LEDGER_ARCHIVE_DIR")]
    pub ledger_archive_dir: Option<PathBuf>,

    /// Clients allowed to call, one `NAME SCOPE[,SCOPE] SHA256_HEX [rate=N] [burst=N]` per line
    /// (hashes, never tokens); re-read on SIGHUP. Without it authentication is off.
    #[arg(long, env = "ALLOCATOR_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// Answer only callers holding the `router` scope (403 for anyone else), so clients must go
    /// through routers. Needs `--auth-file`.
    #[arg(long, env = "ALLOCATOR_REQUIRE_ROUTER", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub require_router: bool,
    /// Requests per second per client (token bucket); off when absent. With routers in front,
    /// set it on the routers; here it counts the client each router names.
    #[arg(long, env = "ALLOCATOR_CLIENT_RATE")]
    pub client_rate: Option<f64>,
    /// Burst per client; default one second's worth of `--client-rate`.
    #[arg(long, env = "ALLOCATOR_CLIENT_BURST")]
    pub client_burst: Option<u32>,
    /// Requests in flight per client before `429`; off when absent.
    #[arg(long, env = "ALLOCATOR_CLIENT_CONCURRENCY")]
    pub client_concurrency: Option<usize>,

    /// Serve HTTPS with this PEM certificate chain (leaf first); needs `--tls-key`. Re-read on
    /// SIGHUP. Without it the replica serves plain HTTP.
    #[arg(long, env = "ALLOCATOR_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, env = "ALLOCATOR_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Require every caller to present a client certificate signed by this PEM CA (mutual TLS
    /// with the routers); needs `--tls-cert`. Re-read on SIGHUP.
    #[arg(long, env = "ALLOCATOR_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
}

/// Validated runtime configuration of one replica.
#[derive(Debug, Clone)]
pub struct AllocatorConfig {
    pub database_url: String,
    /// `None`: the shard is its own catalog.
    pub catalog_url: Option<String>,
    /// `--fence-memory`.
    pub fence_memory: Option<PathBuf>,
    /// Every shard of the cluster (`--shard`); empty when not given.
    pub shards: Vec<schema::shard::ShardTarget>,
    pub listen: SocketAddr,
    pub replica_id: String,
    /// `None` advertises `http://<bound listen address>` (`https://` with [`Self::tls`]).
    pub advertise_url: Option<String>,
    /// `None` runs without publishing hints.
    pub redis_url: Option<String>,
    pub lease_ttl: Duration,
    pub renew_interval: Duration,
    pub lease_margin: Duration,
    pub campaign_interval: Duration,
    pub handoff_listen: bool,
    pub pool_size: NonZeroUsize,
    pub pool_wait: Duration,
    pub statement_timeout: Duration,
    pub idle_in_transaction_timeout: Duration,
    pub lock_timeout: Duration,
    pub commit_lanes: NonZeroUsize,
    /// Group-commit transactions allowed at once however busy the database is: the CPU count,
    /// at most `commit_lanes`.
    pub min_commit_lanes: NonZeroUsize,
    pub group_max_partitions: NonZeroUsize,
    pub set_based_reserves: bool,
    pub batch_max: NonZeroUsize,
    pub queue_capacity: NonZeroUsize,
    pub request_timeout: Duration,
    pub expiry_interval: Duration,
    pub expiry_batch: NonZeroUsize,
    pub http_workers: NonZeroUsize,
    pub settlement_window: Duration,
    /// Longer than `statement_timeout`: a confirmation is stamped with its statement's start and
    /// may commit up to that much later, so only then is a window closed.
    pub settlement_grace: Duration,
    /// The change-event relay; `None` when `--events` is off.
    pub events: Option<crate::events::EventsConfig>,
    pub idempotency_horizon: Duration,
    pub retention_batch: NonZeroUsize,
    /// Where the retention job archives ledger partitions; `None`: it does not.
    pub ledger_archive_dir: Option<PathBuf>,
    /// Authentication and per-client limits.
    pub access: access::Settings,
    /// HTTPS on the listener; `None` serves plain HTTP.
    pub tls: Option<access::tls::ServerTlsSettings>,
}

fn non_zero(value: usize, flag: Flag) -> Result<NonZeroUsize> {
    NonZeroUsize::new(value).ok_or_else(|| anyhow::anyhow!("{flag} must be at least 1, got 0"))
}

impl TryFrom<ServeArgs> for AllocatorConfig {
    type Error = anyhow::Error;

    fn try_from(args: ServeArgs) -> Result<Self> {
        let ms = Duration::from_millis;
        let pool_size = non_zero(args.pool_size, POOL_SIZE)?;
        let commit_lanes = match args.commit_lanes {
            Some(lanes) => non_zero(lanes, COMMIT_LANES)?,
            // Half the pool: the other half serves reads and a lane's statement that was given
            // up (its connection is discarded).
            None => NonZeroUsize::new(pool_size.get() / 2).unwrap_or(NonZeroUsize::MIN),
        };
        let config = AllocatorConfig {
            database_url: args.database_url,
            catalog_url: args.catalog_url.filter(|u| !u.is_empty()),
            fence_memory: args.fence_memory.filter(|p| !p.as_os_str().is_empty()),
            shards: args.shards,
            listen: args.listen,
            replica_id: args.replica_id,
            advertise_url: args.advertise_url.filter(|u| !u.is_empty()),
            redis_url: args.redis_url.filter(|u| !u.is_empty()),
            lease_ttl: ms(args.lease_ttl_ms),
            // A third of the lease; the rest of ttl - margin is three attempts' time.
            renew_interval: ms(args.renew_interval_ms.unwrap_or(args.lease_ttl_ms / 3)),
            lease_margin: ms(args.lease_margin_ms),
            campaign_interval: ms(args.campaign_interval_ms),
            handoff_listen: args.handoff_listen,
            pool_size,
            pool_wait: ms(args.pool_wait_ms),
            statement_timeout: ms(args.statement_timeout_ms),
            idle_in_transaction_timeout: ms(args.idle_in_transaction_timeout_ms),
            lock_timeout: ms(args.lock_timeout_ms),
            commit_lanes,
            min_commit_lanes: std::thread::available_parallelism()
                .unwrap_or(NonZeroUsize::MIN)
                .min(commit_lanes),
            group_max_partitions: non_zero(args.group_max_partitions, GROUP_MAX_PARTITIONS)?,
            set_based_reserves: args.set_based_reserves,
            batch_max: non_zero(args.batch_max, BATCH_MAX)?,
            queue_capacity: non_zero(args.queue_capacity, QUEUE_CAPACITY)?,
            request_timeout: ms(args.request_timeout_ms),
            expiry_interval: ms(args.expiry_interval_ms),
            expiry_batch: non_zero(args.expiry_batch as usize, EXPIRY_BATCH)?,
            http_workers: non_zero(args.http_workers, HTTP_WORKERS)?,
            settlement_window: Duration::from_secs(args.settlement_window_secs),
            settlement_grace: ms(args
                .settlement_grace_ms
                .unwrap_or(args.statement_timeout_ms + 2000)),
            events: args.events.validated()?,
            idempotency_horizon: Duration::from_secs(args.idempotency_horizon_secs),
            retention_batch: non_zero(args.retention_batch, RETENTION_BATCH)?,
            ledger_archive_dir: args.ledger_archive_dir,
            access: access::Settings {
                auth_file: args.auth_file,
                rate: args.client_rate,
                burst: args.client_burst,
                concurrency: args
                    .client_concurrency
                    .map(|n| non_zero(n, CLIENT_CONCURRENCY))
                    .transpose()?,
                require_router: args.require_router,
            },
            tls: access::tls::listener_settings(
                (TLS_CERT_FLAG, args.tls_cert),
                (TLS_KEY_FLAG, args.tls_key),
                (TLS_CLIENT_CA_FLAG, args.tls_client_ca),
            )
            .map_err(anyhow::Error::msg)?,
        };
        config.validate()?;
        Ok(config)
    }
}

impl AllocatorConfig {
    /// Check what the types cannot: positive durations and the relations the lease protocol
    /// relies on. [`crate::app::Application::build`] calls it again, so a configuration changed
    /// after parsing is checked too.
    pub fn validate(&self) -> Result<()> {
        if self.replica_id.is_empty() {
            bail!("{REPLICA_ID} must not be empty");
        }
        self.access
            .validate(&ACCESS_FLAGS)
            .map_err(anyhow::Error::msg)?;
        let positive = [
            (LEASE_TTL, self.lease_ttl),
            (RENEW_INTERVAL, self.renew_interval),
            (LEASE_MARGIN, self.lease_margin),
            (CAMPAIGN_INTERVAL, self.campaign_interval),
            (POOL_WAIT, self.pool_wait),
            (STATEMENT_TIMEOUT, self.statement_timeout),
            (IDLE_IN_TX_TIMEOUT, self.idle_in_transaction_timeout),
            (LOCK_TIMEOUT, self.lock_timeout),
            (REQUEST_TIMEOUT, self.request_timeout),
            (SETTLEMENT_WINDOW, self.settlement_window),
            (IDEMPOTENCY_HORIZON, self.idempotency_horizon),
        ];
        for (flag, value) in positive {
            if value.is_zero() {
                bail!("{flag} must be positive, got 0");
            }
        }
        // The local deadline is `t0 + ttl - margin`: a margin as long as the lease leaves no
        // time in which the replica may write.
        if self.lease_margin >= self.lease_ttl {
            bail!(
                "{LEASE_MARGIN} ({} ms) must be shorter than {LEASE_TTL} ({} ms)",
                self.lease_margin.as_millis(),
                self.lease_ttl.as_millis()
            );
        }
        // Three renewal attempts must fit between the regular renewal and the local deadline
        // (two may fail and the third still lands), or a lease is lost to one slow round trip.
        let attempts = u128::from(RENEW_ATTEMPTS) * MIN_RENEW_ATTEMPT.as_millis();
        if self.renew_interval.as_millis() + attempts
            > (self.lease_ttl - self.lease_margin).as_millis()
        {
            bail!(
                "{RENEW_INTERVAL} ({} ms) must be shorter than {LEASE_TTL} minus {LEASE_MARGIN} \
                 ({} ms) by at least {attempts} ms, the time {RENEW_ATTEMPTS} renewal attempts \
                 need at the least",
                self.renew_interval.as_millis(),
                (self.lease_ttl - self.lease_margin).as_millis()
            );
        }
        if self.expiry_interval < EXPIRY_INTERVAL_MIN {
            bail!(
                "{EXPIRY_INTERVAL} must be at least {} ms, got {} ms",
                EXPIRY_INTERVAL_MIN.as_millis(),
                self.expiry_interval.as_millis()
            );
        }
        // A window closed before every statement stamped inside it has committed could miss a
        // confirmation that commits later.
        if self.settlement_grace <= self.statement_timeout {
            bail!(
                "{SETTLEMENT_GRACE} ({} ms) must be longer than {STATEMENT_TIMEOUT} ({} ms)",
                self.settlement_grace.as_millis(),
                self.statement_timeout.as_millis()
            );
        }
        if self.events.is_some() && self.redis_url.is_none() {
            bail!(
                "{} needs --redis-url (REDIS_URL)",
                crate::events::EVENTS_FLAG
            );
        }
        // Each lane holds a pooled connection while its transaction runs.
        if self.commit_lanes > self.pool_size {
            bail!(
                "{COMMIT_LANES} ({}) must not exceed {POOL_SIZE} ({}): each lane holds a pooled \
                 connection while it commits",
                self.commit_lanes,
                self.pool_size
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
