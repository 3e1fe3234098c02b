//! Command line and runtime configuration.
//!
//! Every flag can also be set from the environment (`env` on every argument), because routers run
//! under orchestrators that configure through the environment. [`ServeArgs`] is the raw command
//! line; [`RouterConfig`] is the validated runtime form with [`Duration`]s, which tests build
//! directly (`RouterConfig::new`) instead of going through clap.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use schema::shard::{ShardName, ShardTarget};

/// Time the router allows, beyond the allocators' request deadline, for an owner's "deadline
/// exceeded" answer to travel back (network, scheduling). See
/// [`ServeArgs::upstream_request_timeout_ms`].
pub const ALLOCATOR_ANSWER_SLACK: Duration = Duration::from_millis(250);

#[derive(Debug, Parser)]
#[command(
    name = "router",
    version,
    about = "Routes the public reservation API to the allocator that owns each partition"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the public API.
    Serve(ServeArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// PostgreSQL holding the lease table (the assignment map) and the reservations: a cluster of
    /// one database (the shard [`schema::shard::DEFAULT_SHARD`]). Not with `--shard`.
    #[arg(long, env = "DATABASE_URL", required_unless_present = "shards")]
    pub database_url: Option<String>,

    /// One shard of a cluster over several PostgreSQL primaries, as `NAME=URL`; repeated, the
    /// catalog (the shard holding the shard map) first and the others in the catalog's order.
    /// In `ROUTER_SHARDS` the shards are separated by spaces, not commas: a multi-host URL (a
    /// primary and its standbys, DESIGN.md §13) has commas of its own.
    #[arg(
        long = "shard",
        env = "ROUTER_SHARDS",
        value_name = "NAME=URL",
        value_delimiter = ' '
    )]
    pub shards: Vec<ShardTarget>,

    /// Redis carrying assignment hints. Optional at runtime: without it (or while it is down) the
    /// router keeps routing correctly from the periodic poll.
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,

    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "ROUTER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,

    /// How often the assignment map is re-read from PostgreSQL regardless of hints; the upper
    /// bound on staleness when Redis is down.
    #[arg(long, env = "ROUTER_POLL_INTERVAL_MS", default_value_t = 1000)]
    pub poll_interval_ms: u64,

    /// Total time one client request may spend retrying upstream before the router answers
    /// `upstream-unavailable`. Longer than one attempt by default, so the owner's own
    /// "deadline exceeded" answer reaches the router and one retry fits after it.
    #[arg(long, env = "ROUTER_RETRY_DEADLINE_MS", default_value_t = 6000)]
    pub retry_deadline_ms: u64,

    /// First retry delay; doubles per attempt up to `--backoff-max-ms`, with jitter.
    #[arg(long, env = "ROUTER_BACKOFF_BASE_MS", default_value_t = 25)]
    pub backoff_base_ms: u64,

    /// Largest retry delay.
    #[arg(long, env = "ROUTER_BACKOFF_MAX_MS", default_value_t = 500)]
    pub backoff_max_ms: u64,

    /// TCP connect timeout towards an allocator.
    #[arg(
        long,
        env = "ROUTER_UPSTREAM_CONNECT_TIMEOUT_MS",
        default_value_t = 500
    )]
    pub upstream_connect_timeout_ms: u64,

    /// Timeout of one upstream attempt (connect, send, full response); also capped by what is
    /// left of the retry deadline. Must be at least the allocators' request deadline plus
    /// [`ALLOCATOR_ANSWER_SLACK`]: an attempt abandoned earlier would be retried while the owner
    /// still works on the first one, feeding a slow owner duplicate jobs for one id.
    #[arg(
        long,
        env = "ROUTER_UPSTREAM_REQUEST_TIMEOUT_MS",
        default_value_t = 5500
    )]
    pub upstream_request_timeout_ms: u64,

    /// The allocators' request deadline (their `--request-timeout-ms`); read from the same
    /// environment variable so a shared environment configures both sides consistently. Only
    /// used to check `--upstream-request-timeout-ms` against it.
    #[arg(long, env = "ALLOCATOR_REQUEST_TIMEOUT_MS", default_value_t = 5000)]
    pub allocator_request_timeout_ms: u64,

    /// PostgreSQL connections per router for routing lookups.
    #[arg(long, env = "ROUTER_DB_POOL_SIZE", default_value_t = 8)]
    pub db_pool_size: usize,

    /// PostgreSQL connections per router for orders: each order in progress holds one (it keeps
    /// its `orders` row locked), so this bounds the orders one router works on at once.
    #[arg(long, env = "ROUTER_ORDERS_DB_POOL_SIZE", default_value_t = 16)]
    pub orders_db_pool_size: usize,

    /// Bound on waiting for a pooled connection, on connecting, and on each routing query.
    #[arg(long, env = "ROUTER_DB_TIMEOUT_MS", default_value_t = 2000)]
    pub db_timeout_ms: u64,

    /// HTTP worker threads; defaults to the number of CPUs.
    #[arg(long, env = "ROUTER_WORKERS")]
    pub workers: Option<usize>,

    /// Clients allowed to call, one `NAME SCOPE[,SCOPE] SHA256_HEX [rate=N] [burst=N]` per line
    /// (hashes, never tokens); re-read on SIGHUP. Without it authentication is off.
    #[arg(long, env = "ROUTER_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,

    /// File holding this router's own token (raw, one line) for the allocators, whose auth files
    /// list its hash with the `router` scope; re-read on SIGHUP. Without it the router calls
    /// allocators without a credential.
    #[arg(long, env = "ROUTER_UPSTREAM_TOKEN_FILE")]
    pub upstream_token_file: Option<PathBuf>,

    /// Requests per second per client (token bucket); off when absent.
    #[arg(long, env = "ROUTER_CLIENT_RATE")]
    pub client_rate: Option<f64>,

    /// Burst per client; default one second's worth of `--client-rate`.
    #[arg(long, env = "ROUTER_CLIENT_BURST")]
    pub client_burst: Option<u32>,

    /// Requests in flight per client before `429`; off when absent.
    #[arg(long, env = "ROUTER_CLIENT_CONCURRENCY")]
    pub client_concurrency: Option<usize>,

    /// Serve HTTPS with this PEM certificate chain (leaf first); needs `--tls-key`. Re-read on
    /// SIGHUP. Without it the router serves plain HTTP.
    #[arg(long, env = "ROUTER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, env = "ROUTER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Verify allocators served over HTTPS against this PEM CA (instead of the system's roots).
    /// Re-read on SIGHUP.
    #[arg(long, env = "ROUTER_UPSTREAM_CA")]
    pub upstream_ca: Option<PathBuf>,
    /// Present this PEM client certificate to allocators (mutual TLS); needs
    /// `--upstream-client-key` and `--upstream-ca`. Re-read on SIGHUP.
    #[arg(long, env = "ROUTER_UPSTREAM_CLIENT_CERT")]
    pub upstream_client_cert: Option<PathBuf>,
    /// The PEM private key of `--upstream-client-cert`.
    #[arg(long, env = "ROUTER_UPSTREAM_CLIENT_KEY")]
    pub upstream_client_key: Option<PathBuf>,
}

/// The access flags, for refusals.
pub const ACCESS_FLAGS: access::Flags = access::Flags {
    auth_file: "--auth-file (ROUTER_AUTH_FILE)",
    rate: "--client-rate (ROUTER_CLIENT_RATE)",
    burst: "--client-burst (ROUTER_CLIENT_BURST)",
    require_router: None,
};
pub const SHARD_FLAG: &str = "--shard (ROUTER_SHARDS)";
pub const DATABASE_URL_FLAG: &str = "--database-url (DATABASE_URL)";
pub const UPSTREAM_TOKEN_FLAG: &str = "--upstream-token-file (ROUTER_UPSTREAM_TOKEN_FILE)";
/// The TLS flags, for refusals.
pub const TLS_CERT_FLAG: &str = "--tls-cert (ROUTER_TLS_CERT)";
pub const TLS_KEY_FLAG: &str = "--tls-key (ROUTER_TLS_KEY)";
pub const UPSTREAM_CA_FLAG: &str = "--upstream-ca (ROUTER_UPSTREAM_CA)";
pub const UPSTREAM_CLIENT_CERT_FLAG: &str = "--upstream-client-cert (ROUTER_UPSTREAM_CLIENT_CERT)";
pub const UPSTREAM_CLIENT_KEY_FLAG: &str = "--upstream-client-key (ROUTER_UPSTREAM_CLIENT_KEY)";

/// Validated runtime configuration.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// The shards, the catalog first: the `--shard` list, or the one database of
    /// `--database-url` as the shard [`schema::shard::DEFAULT_SHARD`].
    pub shards: Vec<ShardTarget>,
    /// `None` runs on polling alone.
    pub redis_url: Option<String>,
    pub listen: String,
    pub poll_interval: Duration,
    pub retry_deadline: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub upstream_connect_timeout: Duration,
    pub upstream_request_timeout: Duration,
    /// The allocators' request deadline; `upstream_request_timeout` must cover it.
    pub allocator_request_timeout: Duration,
    pub db_pool_size: usize,
    pub orders_db_pool_size: usize,
    pub db_timeout: Duration,
    pub workers: Option<usize>,
    /// How long the Redis hint subscription waits between connection attempts at most (backoff cap).
    pub hints_reconnect_max: Duration,
    /// How often the hint subscription pings Redis; a subscription on a frozen server would otherwise look
    /// healthy forever.
    pub hints_ping_interval: Duration,
    /// Authentication and per-client limits of this router's clients.
    pub access: access::Settings,
    /// This router's credential towards allocators; `None` sends none.
    pub upstream_token_file: Option<PathBuf>,
    /// HTTPS on the listener; `None` serves plain HTTP.
    pub tls: Option<access::tls::ServerTlsSettings>,
    /// The CA allocators are verified against, and the client certificate presented to them;
    /// `None` verifies HTTPS allocators against the system's roots.
    pub upstream_tls: Option<access::tls::ClientTlsSettings>,
}

impl RouterConfig {
    /// Defaults matching the command line's, for the given database (a cluster of one shard).
    pub fn new(database_url: impl Into<String>) -> Self {
        RouterConfig {
            shards: vec![ShardTarget {
                name: ShardName::default_shard(),
                url: database_url.into(),
            }],
            redis_url: None,
            listen: "127.0.0.1:8080".to_owned(),
            poll_interval: Duration::from_millis(1000),
            retry_deadline: Duration::from_millis(6000),
            backoff_base: Duration::from_millis(25),
            backoff_max: Duration::from_millis(500),
            upstream_connect_timeout: Duration::from_millis(500),
            upstream_request_timeout: Duration::from_millis(5500),
            allocator_request_timeout: Duration::from_millis(5000),
            db_pool_size: 8,
            orders_db_pool_size: 16,
            db_timeout: Duration::from_millis(2000),
            workers: None,
            hints_reconnect_max: Duration::from_secs(5),
            hints_ping_interval: Duration::from_secs(2),
            access: access::Settings::off(),
            upstream_token_file: None,
            tls: None,
            upstream_tls: None,
        }
    }

    /// How long a submission of an order waits for another submission of the same order id to
    /// finish: one order takes at most two retry deadlines (reserve, then compensation) plus its
    /// database round trips.
    pub fn order_lock_wait(&self) -> Duration {
        self.retry_deadline * 2 + self.db_timeout * 2
    }

    /// The configured shards' names, in order (the catalog's map must list exactly these).
    pub fn shard_names(&self) -> Vec<ShardName> {
        self.shards.iter().map(|s| s.name.clone()).collect()
    }

    pub fn validate(&self) -> Result<()> {
        schema::shard::target_names(&self.shards)
            .map_err(|e| anyhow::anyhow!("{SHARD_FLAG}: {e}"))?;
        let positive = [
            (
                "--poll-interval-ms (ROUTER_POLL_INTERVAL_MS)",
                self.poll_interval,
            ),
            (
                "--retry-deadline-ms (ROUTER_RETRY_DEADLINE_MS)",
                self.retry_deadline,
            ),
            (
                "--backoff-base-ms (ROUTER_BACKOFF_BASE_MS)",
                self.backoff_base,
            ),
            (
                "--upstream-connect-timeout-ms (ROUTER_UPSTREAM_CONNECT_TIMEOUT_MS)",
                self.upstream_connect_timeout,
            ),
            (
                "--upstream-request-timeout-ms (ROUTER_UPSTREAM_REQUEST_TIMEOUT_MS)",
                self.upstream_request_timeout,
            ),
            ("--db-timeout-ms (ROUTER_DB_TIMEOUT_MS)", self.db_timeout),
            ("hints reconnect max", self.hints_reconnect_max),
            ("hints ping interval", self.hints_ping_interval),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                bail!("{name} must be positive");
            }
        }
        if self.backoff_max < self.backoff_base {
            bail!(
                "--backoff-max-ms (ROUTER_BACKOFF_MAX_MS) must be at least --backoff-base-ms \
                 (ROUTER_BACKOFF_BASE_MS)"
            );
        }
        if self.upstream_request_timeout < self.allocator_request_timeout + ALLOCATOR_ANSWER_SLACK {
            bail!(
                "--upstream-request-timeout-ms (ROUTER_UPSTREAM_REQUEST_TIMEOUT_MS, {} ms) must \
                 be at least the allocators' request deadline (ALLOCATOR_REQUEST_TIMEOUT_MS, {} \
                 ms) plus {} ms: a shorter attempt is abandoned and retried while the owner still \
                 works on it",
                self.upstream_request_timeout.as_millis(),
                self.allocator_request_timeout.as_millis(),
                ALLOCATOR_ANSWER_SLACK.as_millis()
            );
        }
        if self.db_pool_size == 0 {
            bail!("--db-pool-size (ROUTER_DB_POOL_SIZE) must be at least 1, got 0");
        }
        if self.orders_db_pool_size == 0 {
            bail!("--orders-db-pool-size (ROUTER_ORDERS_DB_POOL_SIZE) must be at least 1, got 0");
        }
        if self.workers == Some(0) {
            bail!("--workers (ROUTER_WORKERS) must be at least 1, got 0");
        }
        self.access
            .validate(&ACCESS_FLAGS)
            .map_err(anyhow::Error::msg)?;
        Ok(())
    }
}

impl TryFrom<ServeArgs> for RouterConfig {
    type Error = anyhow::Error;

    fn try_from(args: ServeArgs) -> Result<Self> {
        let ms = Duration::from_millis;
        let concurrency = match args.client_concurrency {
            None => None,
            Some(n) => Some(NonZeroUsize::new(n).ok_or_else(|| {
                anyhow::anyhow!(
                    "--client-concurrency (ROUTER_CLIENT_CONCURRENCY) must be at least 1, got 0"
                )
            })?),
        };
        let config = RouterConfig {
            shards: resolve_shards(args.database_url, args.shards)?,
            redis_url: args.redis_url.filter(|u| !u.is_empty()),
            listen: args.listen,
            poll_interval: ms(args.poll_interval_ms),
            retry_deadline: ms(args.retry_deadline_ms),
            backoff_base: ms(args.backoff_base_ms),
            backoff_max: ms(args.backoff_max_ms),
            upstream_connect_timeout: ms(args.upstream_connect_timeout_ms),
            upstream_request_timeout: ms(args.upstream_request_timeout_ms),
            allocator_request_timeout: ms(args.allocator_request_timeout_ms),
            db_pool_size: args.db_pool_size,
            orders_db_pool_size: args.orders_db_pool_size,
            db_timeout: ms(args.db_timeout_ms),
            workers: args.workers,
            access: access::Settings {
                auth_file: args.auth_file,
                rate: args.client_rate,
                burst: args.client_burst,
                concurrency,
                require_router: false,
            },
            upstream_token_file: args.upstream_token_file,
            tls: access::tls::listener_settings(
                (TLS_CERT_FLAG, args.tls_cert),
                (TLS_KEY_FLAG, args.tls_key),
                ("", None),
            )
            .map_err(anyhow::Error::msg)?,
            upstream_tls: access::tls::upstream_settings(
                (UPSTREAM_CA_FLAG, args.upstream_ca),
                (UPSTREAM_CLIENT_CERT_FLAG, args.upstream_client_cert),
                (UPSTREAM_CLIENT_KEY_FLAG, args.upstream_client_key),
            )
            .map_err(anyhow::Error::msg)?,
            ..RouterConfig::new(String::new())
        };
        config.validate()?;
        Ok(config)
    }
}

/// The shards of a command line: the `--shard` list, or the one database of `--database-url`.
/// Both at once is refused rather than guessed at (which would be the catalog?), and so is a name
/// given twice.
fn resolve_shards(
    database_url: Option<String>,
    shards: Vec<ShardTarget>,
) -> Result<Vec<ShardTarget>> {
    let database_url = database_url.filter(|u| !u.is_empty());
    match (database_url, shards.is_empty()) {
        (Some(_), false) => bail!(
            "give either {DATABASE_URL_FLAG} (one database) or {SHARD_FLAG} (several shards), \
             not both"
        ),
        (Some(url), true) => Ok(vec![ShardTarget {
            name: ShardName::default_shard(),
            url,
        }]),
        (None, false) => {
            schema::shard::target_names(&shards)
                .map_err(|e| anyhow::anyhow!("{SHARD_FLAG}: {e}"))?;
            Ok(shards)
        }
        (None, true) => bail!("give {DATABASE_URL_FLAG} or at least one {SHARD_FLAG}"),
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
