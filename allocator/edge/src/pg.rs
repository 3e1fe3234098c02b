//! PostgreSQL sessions of both services: pooled, behind the storage fence, and bounded on both
//! ends.
//!
//! deadpool's timeouts default to "wait forever" and only work with a runtime set
//! (`storage::build_pool` sets `.runtime(Tokio1)`), so every wait is configured here. Every
//! session carries the same client-side limits (a connect timeout, TCP keepalives so a
//! black-holed link ends the session instead of hanging it) and server-side ones: a SIGSTOPped
//! process keeps its locks until PostgreSQL drops its session, and
//! `idle_in_transaction_session_timeout` is what bounds that; `statement_timeout` and
//! `lock_timeout` keep one slow statement from holding a connection indefinitely.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use storage::pooling::PoolingCheck;
use storage::{PoolLimits, StorageFence};

/// How long a TCP connection may be idle before the kernel starts probing it.
pub const KEEPALIVES_IDLE: Duration = Duration::from_secs(5);

/// One pool's size and limits.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub size: usize,
    /// How long a caller waits for a pooled connection.
    pub wait: Duration,
    /// Connecting (and creating or recycling a pooled connection) may take this long.
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
    pub idle_in_transaction_timeout: Duration,
    /// Lock waits fail fast so an acquire never queues behind a paused owner for long.
    pub lock_timeout: Duration,
    pub application_name: String,
}

/// The client-side settings of every session, pooled or not: its name in `pg_stat_activity`,
/// a connect timeout and TCP keepalives.
pub fn session(config: &mut tokio_postgres::Config, application_name: &str, connect: Duration) {
    config.application_name(application_name);
    config.connect_timeout(connect);
    config.keepalives(true);
    config.keepalives_idle(KEEPALIVES_IDLE);
}

/// A pool whose connections `fence` judges, every session with [`session`]'s settings and the
/// server-side timeouts of `settings`. Connections are made on first use, so a service starts
/// even while PostgreSQL is down.
pub fn build_pool(fence: &Arc<StorageFence>, settings: &PoolSettings) -> anyhow::Result<Pool> {
    let mut pg = fence.config().clone();
    session(
        &mut pg,
        &settings.application_name,
        settings.connect_timeout,
    );
    storage::build_pool(
        fence,
        pg,
        &PoolLimits {
            size: settings.size,
            wait: settings.wait,
            create: settings.connect_timeout,
            recycle: settings.connect_timeout,
        },
        server_settings(settings),
    )
}

/// Refuses to start behind a connection pooler that multiplexes sessions (PgBouncer in
/// transaction or statement mode; [`storage::pooling`] says why and how it is detected). When
/// the check cannot decide (the database is down), the service starts and says so.
pub async fn require_session_pooling(
    fence: &StorageFence,
    application_name: &str,
) -> anyhow::Result<()> {
    let mut config = fence.config().clone();
    session(
        &mut config,
        &format!("{application_name}:pooling-check"),
        CHECK_CONNECT,
    );
    match storage::pooling::check(&config).await {
        PoolingCheck::Session => Ok(()),
        PoolingCheck::Multiplexed(how) => {
            anyhow::bail!("{} ({how})", storage::pooling::MULTIPLEXED_HELP)
        }
        PoolingCheck::Unknown(error) => {
            tracing::warn!(
                error = %format!("{error:#}"),
                "could not check that each database connection is its own server session \
                 (no PgBouncer in transaction mode); starting anyway"
            );
            Ok(())
        }
    }
}

/// Connect timeout of the start-up pooling check's sessions.
const CHECK_CONNECT: Duration = Duration::from_secs(3);

/// The `SET` statements, run once per new connection, that set the server-side timeouts of a
/// session (not startup `options`, which PgBouncer refuses), and generic plans for
/// every prepared statement: the allocator's set-based reserve statement (a chain of CTEs over
/// array parameters) costs about 0.35 ms to plan and 0.2 ms to run for one command, and
/// PostgreSQL's default keeps re-planning it for small groups because a custom plan for a
/// one-element array looks cheaper than the generic one. Every statement of the services is a
/// key lookup or a set-based write over arrays, which the generic plan does as well (measured
/// with `ops/bench/fenced-cost.sh`; ops/BENCHMARKS.md "What a reserve costs").
fn server_settings(settings: &PoolSettings) -> String {
    format!(
        "SET plan_cache_mode = force_generic_plan; SET statement_timeout = {}; \
         SET idle_in_transaction_session_timeout = {}; SET lock_timeout = {}",
        settings.statement_timeout.as_millis(),
        settings.idle_in_transaction_timeout.as_millis(),
        settings.lock_timeout.as_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_settings_name_every_timeout_in_milliseconds() {
        let settings = PoolSettings {
            size: 1,
            wait: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(3),
            statement_timeout: Duration::from_millis(1500),
            idle_in_transaction_timeout: Duration::from_secs(4),
            lock_timeout: Duration::from_millis(250),
            application_name: "test".into(),
        };
        assert_eq!(
            server_settings(&settings),
            "SET plan_cache_mode = force_generic_plan; SET statement_timeout = 1500; \
             SET idle_in_transaction_session_timeout = 4000; SET lock_timeout = 250"
        );
    }

    #[test]
    fn every_session_has_keepalives_and_a_connect_timeout() {
        let mut config = tokio_postgres::Config::new();
        session(&mut config, "router", Duration::from_secs(2));
        assert_eq!(config.get_application_name(), Some("router"));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(2)));
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), KEEPALIVES_IDLE);
    }
}
