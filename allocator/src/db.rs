//! Connection pools with explicit sizes, timeouts and server-side limits, every one behind the
//! storage fence.
//!
//! deadpool's timeouts default to "wait forever" and only work with a runtime set, so both are
//! always configured here. Every connection also carries server-side timeouts: a SIGSTOPped
//! replica keeps its locks until PostgreSQL drops its session, and `idle_in_transaction_session_timeout`
//! is what bounds that.
//!
//! The database URL may name several hosts (a primary and its standbys). Which of them a
//! connection goes to is decided by the one [`StorageFence`] of the process (the `storage`
//! crate, DESIGN.md §13): only the newest primary it knows of, never a revived old one.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use storage::{FenceSettings, PoolLimits, StorageFence};
use tokio_postgres::NoTls;

#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub size: usize,
    pub wait: Duration,
    pub statement_timeout: Duration,
    pub idle_in_transaction_timeout: Duration,
    /// Lock waits fail fast so an acquire never queues behind a paused owner for long.
    pub lock_timeout: Duration,
    pub application_name: String,
}

/// How often the fence reads every configured host; a promotion is learnt within this even
/// while no connection is made.
pub const FENCE_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// The process's storage fence for `database_url`. An allocator stamps a new generation on a
/// primary it finds promoted.
pub fn fence(database_url: &str, application_name: &str) -> anyhow::Result<Arc<StorageFence>> {
    StorageFence::new(
        database_url,
        FenceSettings {
            metrics: crate::metrics::STORAGE_METRICS,
            probe_interval: FENCE_PROBE_INTERVAL,
            probe_timeout: Duration::from_secs(3),
            stamp: true,
            application_name: format!("{application_name}:fence"),
        },
    )
}

/// A pool behind a fence of its own (no prober): for tools and tests with one pool. A replica
/// shares one fence between its pools ([`build_fenced_pool`]).
pub fn build_pool(database_url: &str, settings: &PoolSettings) -> anyhow::Result<Pool> {
    build_fenced_pool(&fence(database_url, &settings.application_name)?, settings)
}

/// A pool whose connections `fence` judges.
pub fn build_fenced_pool(
    fence: &Arc<StorageFence>,
    settings: &PoolSettings,
) -> anyhow::Result<Pool> {
    let mut pg = fence.config().clone();
    pg.application_name(&settings.application_name);
    pg.connect_timeout(Duration::from_secs(3));
    pg.keepalives(true);
    pg.keepalives_idle(Duration::from_secs(5));
    // Generic plans for every prepared statement: the set-based reserve statement (a chain of
    // eight CTEs over array parameters) costs about 0.35 ms to plan and 0.2 ms to run for one
    // command, and PostgreSQL's default keeps re-planning it for small groups because a custom
    // plan for a one-element array looks cheaper than the generic one. Every statement of the
    // services is a key lookup or a set-based write over arrays, which the generic plan does
    // as well (measured with `ops/bench/fenced-cost.sh`; README "What a reserve costs").
    pg.options(format!(
        "-c plan_cache_mode=force_generic_plan \
         -c statement_timeout={} -c idle_in_transaction_session_timeout={} -c lock_timeout={}",
        settings.statement_timeout.as_millis(),
        settings.idle_in_transaction_timeout.as_millis(),
        settings.lock_timeout.as_millis()
    ));
    storage::build_pool(
        fence,
        pg,
        &PoolLimits {
            size: settings.size,
            wait: settings.wait,
            create: Duration::from_secs(3),
            recycle: Duration::from_secs(1),
        },
    )
}

/// Connect once, outside any pool (for `migrate`), to the newest primary among the URL's hosts.
pub async fn connect(database_url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let fence = fence(database_url, "allocator:migrate")?;
    storage::connect(&fence, fence.config()).await
}

/// A `LISTEN` session on one notification channel, outside any pool: it must stay connected
/// and idle, which a pooled connection is not.
pub struct Listener {
    database_url: String,
    channel: &'static str,
}

pub fn listen(database_url: &str, channel: &'static str) -> Listener {
    Listener {
        database_url: database_url.to_owned(),
        channel,
    }
}

impl Listener {
    /// Connect, `LISTEN`, and call `on_notification` for every notification until the
    /// connection ends (the caller reconnects).
    pub async fn run(self, mut on_notification: impl FnMut()) -> anyhow::Result<()> {
        use futures::StreamExt;

        let mut pg: tokio_postgres::Config = self.database_url.parse()?;
        pg.application_name("allocator:listener");
        pg.connect_timeout(Duration::from_secs(3));
        // A black-holed link must end the session so the loop reconnects.
        pg.keepalives(true);
        pg.keepalives_idle(Duration::from_secs(5));
        let (client, mut connection) = pg.connect(NoTls).await?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // The connection delivers notifications only while it is polled, including while the
        // LISTEN statement itself runs; so it is driven by its own task.
        let driver = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notification(_) = message? {
                    let _ = tx.send(());
                }
            }
            Ok::<_, tokio_postgres::Error>(())
        });
        client
            .batch_execute(&format!("LISTEN {}", self.channel))
            .await?;
        while rx.recv().await.is_some() {
            on_notification();
        }
        drop(client);
        driver.await??;
        Ok(())
    }
}
