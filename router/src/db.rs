//! The router's PostgreSQL access: a small bounded pool per shard and its read-only lookups (the
//! assignment map, the catalog's shard map, the partition of an existing reservation, the
//! settlement job's status).
//!
//! Every shard has a storage fence, a map-lookup pool and an orders pool of its own
//! ([`ShardDb`]): a fence remembers one cluster (DESIGN.md §13), and a shard that is down or slow
//! then exhausts only its own pools, so it stops only its own partitions and the orders stored
//! on it.
//!
//! deadpool's timeouts default to none, which would let a frozen database park every request
//! forever; every wait here is bounded by `db_timeout` (waiting for a pooled connection,
//! connecting, recycling, and each query as a whole), and every session has the server-side
//! timeouts of [`edge::pg`].

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use edge::pg::PoolSettings;
use futures::stream::{FuturesUnordered, StreamExt};
use schema::shard::{ShardMap, ShardName, ShardTarget};
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
    #[error("{0}")]
    Schema(#[from] schema::SchemaError),
    #[error("the shard of partition {0} is not known yet")]
    Placement(u32),
}

/// How often the fence reads every configured host.
pub const FENCE_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// One shard's connections: its fence, the pool for routing lookups (`--db-pool-size`) and the
/// pool for orders (`--orders-db-pool-size`), both through the fence.
pub struct ShardDb {
    pub name: ShardName,
    pub fence: Arc<StorageFence>,
    pub pool: Pool,
    pub orders_pool: Pool,
}

impl ShardDb {
    /// The fence and pools of `shard`, without connecting (see [`build_pool`]).
    pub fn new(config: &RouterConfig, shard: &ShardTarget) -> anyhow::Result<Self> {
        let fence = fence(config, shard)?;
        Ok(Self {
            name: shard.name.clone(),
            pool: build_pool(&fence, config, config.db_pool_size)?,
            orders_pool: build_pool(&fence, config, config.orders_db_pool_size)?,
            fence,
        })
    }
}

/// A shard's storage fence (DESIGN.md §13): the map is read only from the newest primary among
/// the URL's hosts, never from a revived old one that still shows the leases it had. The router
/// only reads, so it never stamps a generation. Its series carry the shard's name as `shard`.
pub fn fence(config: &RouterConfig, shard: &ShardTarget) -> anyhow::Result<Arc<StorageFence>> {
    StorageFence::new(
        &shard.url,
        FenceSettings {
            metrics: crate::metrics::STORAGE_METRICS,
            probe_interval: FENCE_PROBE_INTERVAL,
            probe_timeout: config.db_timeout,
            stamp: false,
            application_name: "router:fence".to_owned(),
            shard: Some(shard.name.to_string()),
            // The router only reads the map; the allocators' fences guard every write.
            memory: None,
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

/// The catalog's shard map ([`schema::shard::store::read_map_if_migrated`]): `None` on a
/// database that holds none (not the catalog, or not migrated that far).
pub async fn read_shard_map(pool: &Pool, timeout: Duration) -> Result<Option<ShardMap>, DbError> {
    bounded(timeout, async {
        let client = pool.get().await?;
        Ok(schema::shard::store::read_map_if_migrated(&**client).await?)
    })
    .await
}

/// The partition of reservation `id`, or `None` if no such reservation exists.
///
/// A reservation id names no shard, so every shard is asked at once. Only the shard the catalog's
/// map names for the row's partition (`shard_of`) answers: a shard the partition moved away from
/// keeps a frozen copy of its reservations (DESIGN.md §12), which is never the live one, and an id
/// names one command in the cluster (I3), so at most one shard holds it live. `None` needs every
/// shard's `None` (or frozen copy); a shard that fails while none knows the id is that shard's
/// error, because the reservation may be exactly there (never "not found"), and so is a row whose
/// partition's shard is not known yet.
pub async fn reservation_partition(
    pools: &[Pool],
    timeout: Duration,
    id: &str,
    shard_of: impl Fn(u32) -> Option<usize>,
) -> Result<Option<schema::assignment::ReservationPlace>, DbError> {
    let mut lookups: FuturesUnordered<_> = pools
        .iter()
        .enumerate()
        .map(|(index, pool)| async move {
            let place = on_connection(pool, timeout, async |client| {
                schema::assignment::reservation_partition(client, id).await
            })
            .await;
            (index, place)
        })
        .collect();
    let mut failure = None;
    while let Some((index, answer)) = lookups.next().await {
        match answer {
            Ok(Some(place)) => match shard_of(place.partition) {
                Some(holder) if holder == index => return Ok(Some(place)),
                Some(_) => {}
                None => {
                    failure = failure.or(Some(DbError::Placement(place.partition)));
                }
            },
            Ok(None) => {}
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(None),
    }
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
    query: &schema::events::EventQuery,
) -> Result<Vec<schema::events::Event>, DbError> {
    on_connection(pool, timeout, async |client| {
        schema::events::read::stream_after(client, &query.stream, query.after, query.limit).await
    })
    .await
}

/// Run `read` on a pooled connection; the wait for the connection and the read together are
/// bounded by `timeout`.
pub(crate) async fn on_connection<T>(
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
