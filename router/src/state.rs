//! What every HTTP handler shares: built once by [`crate::app::Application::build`], outside
//! actix's per-worker factory, and handed to the routes. Kept apart from the wiring so that the
//! routes depend on this and not on the application that registers them.

use std::sync::Arc;
use std::time::Duration;

use actix_web::HttpResponse;
use deadpool_postgres::Pool;
use metrics_exporter_prometheus::PrometheusHandle;
use schema::shard::ShardName;

use crate::assignment_cache::AssignmentCache;
use crate::error::RouterError;
use crate::forward::{Forwarder, UpstreamRequest};
use crate::orders::store::OrderStore;

/// Shared by all HTTP workers.
pub struct AppState {
    pub forwarder: Arc<Forwarder>,
    pub cache: Arc<AssignmentCache>,
    /// Every shard's map-lookup pool, in the configured order (the catalog first): reservation
    /// → partition lookups, settlement status, events.
    pub pools: Vec<Pool>,
    /// The shards' names, in the order of `pools`.
    pub shard_names: Vec<ShardName>,
    /// Serialises submissions of one order id (its own pool: each order in progress holds a
    /// connection).
    pub orders: Arc<OrderStore>,
    pub db_timeout: Duration,
    pub metrics: PrometheusHandle,
}

impl AppState {
    /// The cluster's partition count, known once a map has been loaded.
    pub fn partition_count(&self) -> Result<u32, RouterError> {
        match self.cache.current() {
            Some(map) if map.partition_count() > 0 => Ok(map.partition_count()),
            _ => Err(RouterError::Upstream {
                status: 503,
                outcome_unknown: false,
                partition: None,
                detail: "assignment map not loaded yet".to_owned(),
            }),
        }
    }

    /// The catalog's pool (the first shard's).
    pub fn catalog_pool(&self) -> &Pool {
        &self.pools[0]
    }

    /// Every shard's name with its map-lookup pool, the catalog first.
    pub fn shards(&self) -> Vec<(ShardName, Pool)> {
        self.shard_names
            .iter()
            .cloned()
            .zip(self.pools.iter().cloned())
            .collect()
    }

    /// The pool of the shard holding `partition`; a `503` while the catalog's placement is not
    /// known (another shard's rows would answer as if the partition had none).
    pub fn pool_of(&self, partition: u32) -> Result<&Pool, RouterError> {
        self.cache
            .shard_of(partition)
            .and_then(|i| self.pools.get(i))
            .ok_or_else(|| {
                RouterError::Storage(format!(
                    "the shard of partition {partition} is not known yet"
                ))
            })
    }

    /// The partition of `sku`, by the one shared hash.
    pub fn partition_of(&self, sku: &str) -> Result<u32, RouterError> {
        Ok(schema::partition::partition_for(
            sku,
            self.partition_count()?,
        ))
    }

    /// Forward one client request to its partition's owner (retrying as the forwarder does) and
    /// answer with what the owner answered: how every single-partition route ends.
    pub async fn forward(&self, upstream: &UpstreamRequest) -> Result<HttpResponse, RouterError> {
        Ok(self.forwarder.forward(upstream).await?.into_http_response())
    }
}
