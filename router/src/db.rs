//! The router's PostgreSQL access: a small bounded pool and its read-only lookups (the assignment
//! map, the partition of an existing reservation, the settlement job's status).
//!
//! deadpool's timeouts default to none, which would let a frozen database park every request
//! forever; every wait here is bounded by `db_timeout` (waiting for a pooled connection,
//! connecting, recycling, and each query as a whole), and every session has the server-side
//! timeouts of [`edge::pg`].

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use edge::pg::PoolSettings;
use schema::wire::PartitionMap;
use storage::{FenceSettings, StorageFence};

use crate::config::RouterConfig;

/// Why a database lookup failed; both kinds mean "try again later", never "not found".
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database did not answer within {0:?}")]
    Timeout(Duration),
    #[error("no database connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("query failed: {0}")]
    Query(#[from] tokio_postgres::Error),
}

/// How often the fence reads every configured host.
pub const FENCE_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// The router's storage fence (DESIGN.md §13): the map is read only from the newest primary
/// among the URL's hosts, never from a revived old one that still shows the leases it had. The
/// router only reads, so it never stamps a generation.
pub fn fence(config: &RouterConfig) -> anyhow::Result<Arc<StorageFence>> {
    StorageFence::new(
        &config.database_url,
        FenceSettings {
            metrics: crate::metrics::STORAGE_METRICS,
            probe_interval: FENCE_PROBE_INTERVAL,
            probe_timeout: config.db_timeout,
            stamp: false,
            application_name: "router:fence".to_owned(),
        },
    )
}

/// A pool of `size` connections ([`edge::pg::build_pool`]: the allocator's keepalives and
/// server-side timeouts), without connecting: connections are made on first use, so the router
/// starts even while PostgreSQL is down. A statement may run as long as an order's lock wait
/// (the one statement that waits), a lock wait and an idle transaction as long as the order
/// store allows (it narrows both per transaction, `SET LOCAL`).
pub fn build_pool(
    fence: &Arc<StorageFence>,
    config: &RouterConfig,
    size: usize,
) -> anyhow::Result<Pool> {
    let lock_wait = config.order_lock_wait();
    edge::pg::build_pool(
        fence,
        &PoolSettings {
            size,
            wait: config.db_timeout,
            connect_timeout: config.db_timeout,
            statement_timeout: lock_wait + config.db_timeout,
            idle_in_transaction_timeout: lock_wait * 2,
            lock_timeout: lock_wait,
            application_name: "router".to_owned(),
        },
    )
}

/// Read the whole assignment map with [`schema::assignment::read_map`].
pub async fn read_map(pool: &Pool, timeout: Duration) -> Result<PartitionMap, DbError> {
    on_connection(pool, timeout, async |client| {
        schema::assignment::read_map(client).await
    })
    .await
}

/// The partition of reservation `id`, or `None` if no such reservation exists.
pub async fn reservation_partition(
    pool: &Pool,
    timeout: Duration,
    id: &str,
) -> Result<Option<schema::assignment::ReservationPlace>, DbError> {
    on_connection(pool, timeout, async |client| {
        schema::assignment::reservation_partition(client, id).await
    })
    .await
}

/// The settlement job's status, read like any allocator reads it.
pub async fn settlement_status(
    pool: &Pool,
    timeout: Duration,
) -> Result<schema::wire::SettlementStatus, DbError> {
    on_connection(pool, timeout, async |client| {
        schema::settlement::read_status(client).await
    })
    .await
}

/// One page of a change-event stream, read like any allocator reads it.
pub async fn events(
    pool: &Pool,
    timeout: Duration,
    query: schema::events::EventQuery,
) -> Result<Vec<schema::events::Event>, DbError> {
    on_connection(pool, timeout, async |client| {
        schema::events::read::stream_after(client, query.stream, query.after, query.limit).await
    })
    .await
}

/// Run `read` on a pooled connection; the wait for the connection and the read together are
/// bounded by `timeout`.
async fn on_connection<T>(
    pool: &Pool,
    timeout: Duration,
    read: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, tokio_postgres::Error>,
) -> Result<T, DbError> {
    bounded(timeout, async {
        let client = pool.get().await?;
        Ok(read(&**client).await?)
    })
    .await
}

/// Bound a database operation by `timeout`, as a [`DbError::Timeout`].
pub(crate) async fn bounded<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, DbError>>,
) -> Result<T, DbError> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or(Err(DbError::Timeout(timeout)))
}
