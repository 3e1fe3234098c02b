//! Connection pools with explicit sizes, timeouts and server-side limits.
//!
//! deadpool's timeouts default to "wait forever" and only work with a runtime set, so both are
//! always configured here. Every connection also carries server-side timeouts: a SIGSTOPped
//! replica keeps its locks until PostgreSQL drops its session, and `idle_in_transaction_session_timeout`
//! is what bounds that.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
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

pub fn build_pool(database_url: &str, settings: &PoolSettings) -> anyhow::Result<Pool> {
    let mut pg: tokio_postgres::Config = database_url.parse()?;
    pg.application_name(&settings.application_name);
    pg.connect_timeout(Duration::from_secs(3));
    pg.keepalives(true);
    pg.keepalives_idle(Duration::from_secs(5));
    pg.options(format!(
        "-c statement_timeout={} -c idle_in_transaction_session_timeout={} -c lock_timeout={}",
        settings.statement_timeout.as_millis(),
        settings.idle_in_transaction_timeout.as_millis(),
        settings.lock_timeout.as_millis()
    ));
    let manager = Manager::from_config(
        pg,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(settings.size)
        .wait_timeout(Some(settings.wait))
        .create_timeout(Some(Duration::from_secs(3)))
        .recycle_timeout(Some(Duration::from_secs(1)))
        .runtime(Runtime::Tokio1)
        .build()?;
    Ok(pool)
}

/// Connect once, outside any pool (for `migrate`).
pub async fn connect(database_url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(database_url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "migration connection closed");
        }
    });
    Ok(client)
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
