//! The replica's PostgreSQL sessions: pools (built by [`edge::pg`] with the same timeouts and
//! server-side limits as the router's), every one behind the storage fence, and the `LISTEN`
//! session outside any pool.
//!
//! The database URL may name several hosts (a primary and its standbys). Which of them a
//! connection goes to is decided by the one [`StorageFence`] of the process (the `storage`
//! crate, DESIGN.md §13): only the newest primary it knows of, never a revived old one.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use storage::{FenceSettings, StorageFence};

pub use edge::pg::PoolSettings;

/// How often the fence reads every configured host; a promotion is learnt within this even
/// while no connection is made.
pub const FENCE_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// How long connecting to PostgreSQL may take, for every pool and session of a replica.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The process's storage fence for `database_url`. An allocator stamps a new generation on a
/// primary it finds promoted.
pub fn fence(database_url: &str, application_name: &str) -> anyhow::Result<Arc<StorageFence>> {
    remembering_fence(database_url, application_name, None)
}

/// [`fence`] keeping what it knows in `memory` across restarts (`--fence-memory`).
pub fn remembering_fence(
    database_url: &str,
    application_name: &str,
    memory: Option<std::path::PathBuf>,
) -> anyhow::Result<Arc<StorageFence>> {
    StorageFence::new(
        database_url,
        FenceSettings {
            metrics: crate::metrics::STORAGE_METRICS,
            probe_interval: FENCE_PROBE_INTERVAL,
            probe_timeout: CONNECT_TIMEOUT,
            stamp: true,
            application_name: format!("{application_name}:fence"),
            // A replica serves one database: its series need no shard label.
            shard: None,
            memory,
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
    edge::pg::build_pool(fence, settings)
}

/// Connect once, outside any pool (for `migrate`), to the newest primary among the URL's hosts.
pub async fn connect(database_url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let fence = fence(database_url, "allocator:migrate")?;
    edge::pg::require_session_pooling(&fence, "allocator:migrate").await?;
    storage::connect(&fence, fence.config()).await
}

/// A `LISTEN` session on one notification channel, outside any pool: it must stay connected
/// and idle, which a pooled connection is not. It passes the same storage fence as every pooled
/// session ([`storage::connect_listening`]): on a revived old primary it would hear nothing its
/// peers announce on the new one.
pub struct Listener {
    fence: Arc<StorageFence>,
    channel: &'static str,
}

pub fn listen(fence: &Arc<StorageFence>, channel: &'static str) -> Listener {
    Listener {
        fence: fence.clone(),
        channel,
    }
}

/// How often a listening session checks that its server is still the newest primary known.
const SUPERSEDED_CHECK: Duration = Duration::from_millis(500);

impl Listener {
    /// Connect, `LISTEN`, and call `on_notification` for every notification until the
    /// connection ends or the fence learns of a newer primary (the caller reconnects).
    pub async fn run(self, mut on_notification: impl FnMut()) -> anyhow::Result<()> {
        let mut pg = self.fence.config().clone();
        // Keepalives: a black-holed link must end the session so the loop reconnects.
        edge::pg::session(&mut pg, "allocator:listener", CONNECT_TIMEOUT);
        let (client, mut notifications, created) =
            storage::connect_listening(&self.fence, &pg).await?;
        client
            .batch_execute(&format!("LISTEN {}", self.channel))
            .await?;
        let mut check = tokio::time::interval(SUPERSEDED_CHECK);
        loop {
            tokio::select! {
                notification = notifications.recv() => match notification {
                    Some(_) => on_notification(),
                    None => anyhow::bail!("the listening session ended"),
                },
                _ = check.tick() => {
                    if self.fence.superseded(created) {
                        anyhow::bail!("the listening session's server was superseded");
                    }
                }
            }
        }
    }
}
