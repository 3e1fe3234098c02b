//! [`AssignmentCache`]: the per-shard slots with their PostgreSQL sources, the catalog's
//! placement, and the routing view built from both.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use schema::shard::ShardName;
use tokio::sync::Mutex;

use super::{ClusterMap, MapSlot, Offer, Placement, RoutingMap};
use crate::db::{self, DbError};
use crate::metrics::{self, RefreshCause};

/// One shard's slot and where it is read from.
struct ShardSource {
    name: ShardName,
    pool: Pool,
    slot: MapSlot,
    /// Held during this shard's read; guards the start time of its latest read attempt, which
    /// is what waiters compare their `fresh_after` with.
    refresh: Mutex<Option<Instant>>,
}

/// The map cache with its PostgreSQL sources: one per shard, the first being the catalog.
pub struct AssignmentCache {
    shards: Vec<ShardSource>,
    configured: Vec<ShardName>,
    /// Bound on one read (of a shard's map, of the catalog's shard map).
    db_timeout: Duration,
    /// The catalog read's coalescing lock, like a shard's.
    catalog_refresh: Mutex<Option<Instant>>,
    placement: RwLock<Placement>,
    /// Rebuilt, under its write lock, after every change of a slot or of the placement.
    view: RwLock<Option<Arc<ClusterMap>>>,
    read_seq: AtomicU64,
}

impl AssignmentCache {
    /// The cache of a one-database cluster: one shard, [`schema::shard::DEFAULT_SHARD`].
    pub fn new(pool: Pool, db_timeout: Duration) -> Self {
        Self::with_shards(vec![(ShardName::default_shard(), pool)], db_timeout)
    }

    /// The cache over `shards` (the configured shards in order, the catalog first, each with its
    /// map-lookup pool).
    pub fn with_shards(shards: Vec<(ShardName, Pool)>, db_timeout: Duration) -> Self {
        AssignmentCache {
            configured: shards.iter().map(|(name, _)| name.clone()).collect(),
            shards: shards
                .into_iter()
                .map(|(name, pool)| ShardSource {
                    name,
                    pool,
                    slot: MapSlot::default(),
                    refresh: Mutex::new(None),
                })
                .collect(),
            db_timeout,
            catalog_refresh: Mutex::new(None),
            placement: RwLock::new(Placement::Unread),
            view: RwLock::new(None),
            read_seq: AtomicU64::new(0),
        }
    }

    /// The map to route by; `None` until the catalog's placement agrees with the configured
    /// shards and at least one shard's map has been read (see [`ClusterMap::compose`]).
    pub fn current(&self) -> Option<Arc<ClusterMap>> {
        read_lock(&self.view).clone()
    }

    /// The catalog's placement as last read.
    pub fn placement(&self) -> Placement {
        read_lock(&self.placement).clone()
    }

    /// The configured shards, in order.
    pub fn shard_names(&self) -> &[ShardName] {
        &self.configured
    }

    /// Re-read the catalog's shard map and every shard's map, concurrently, each unless a read
    /// of it started at or after `fresh_after` already completed (or failed) while this caller
    /// waited. Returns the current map afterwards.
    ///
    /// Only the caller that actually read sees a database error (the first of its failed reads;
    /// the others are logged); coalesced waiters get the (possibly stale) current map and carry
    /// on with their own retry loop. A shard that fails keeps its last map.
    pub async fn refresh(
        &self,
        cause: RefreshCause,
        fresh_after: Instant,
    ) -> Result<Option<Arc<ClusterMap>>, DbError> {
        let all: Vec<usize> = (0..self.shards.len()).collect();
        self.refresh_reads(true, &all, cause, fresh_after).await
    }

    /// [`AssignmentCache::refresh`] of the shard holding `partition` only (every shard, and the
    /// catalog, while the placement is not known), so a request never waits for another shard.
    pub async fn refresh_partition(
        &self,
        partition: u32,
        cause: RefreshCause,
        fresh_after: Instant,
    ) -> Result<Option<Arc<ClusterMap>>, DbError> {
        match self.shard_of(partition) {
            Some(index) => self.refresh_shards(&[index], cause, fresh_after).await,
            None => self.refresh(cause, fresh_after).await,
        }
    }

    /// [`AssignmentCache::refresh`] of the shards `indexes` only (not the catalog).
    pub async fn refresh_shards(
        &self,
        indexes: &[usize],
        cause: RefreshCause,
        fresh_after: Instant,
    ) -> Result<Option<Arc<ClusterMap>>, DbError> {
        self.refresh_reads(false, indexes, cause, fresh_after).await
    }

    /// The shard holding `partition` by the current placement, if it is known.
    pub fn shard_of(&self, partition: u32) -> Option<usize> {
        match &*read_lock(&self.placement) {
            Placement::Single => Some(0),
            Placement::Mapped(map) => map.shard_index(partition),
            Placement::Unread | Placement::Refused(_) => None,
        }
    }

    async fn refresh_reads(
        &self,
        catalog: bool,
        indexes: &[usize],
        cause: RefreshCause,
        fresh_after: Instant,
    ) -> Result<Option<Arc<ClusterMap>>, DbError> {
        let counted = AtomicBool::new(false);
        let catalog_read = async {
            if catalog {
                self.read_catalog(cause, fresh_after, &counted).await
            } else {
                Ok(())
            }
        };
        let shard_reads = futures::future::join_all(
            indexes
                .iter()
                .filter(|i| **i < self.shards.len())
                .map(|i| self.read_shard(*i, cause, fresh_after, &counted)),
        );
        let (catalog_result, shard_results) = tokio::join!(catalog_read, shard_reads);
        let mut errors = std::iter::once(catalog_result)
            .chain(shard_results)
            .filter_map(Result::err);
        match errors.next() {
            Some(e) => {
                metrics::record_map_refresh_failure(cause);
                Err(e)
            }
            None => Ok(self.current()),
        }
    }

    /// Count this refresh once, when its first read starts.
    fn count(cause: RefreshCause, counted: &AtomicBool) {
        if !counted.swap(true, Ordering::Relaxed) {
            metrics::record_map_refresh(cause);
        }
    }

    async fn read_shard(
        &self,
        index: usize,
        cause: RefreshCause,
        fresh_after: Instant,
        counted: &AtomicBool,
    ) -> Result<(), DbError> {
        let source = &self.shards[index];
        let mut last_started = source.refresh.lock().await;
        if last_started.is_some_and(|started| started >= fresh_after) {
            return Ok(());
        }
        *last_started = Some(Instant::now());
        let read_seq = self.read_seq.fetch_add(1, Ordering::Relaxed) + 1;
        Self::count(cause, counted);
        match db::read_map(&source.pool, self.db_timeout).await {
            Ok(map) => {
                // Installed while still holding the lock, so a waiter satisfied by this read
                // sees it.
                self.install(index, RoutingMap { map, read_seq }, cause);
                Ok(())
            }
            Err(e) => {
                metrics::record_shard_map_read_failure(source.name.as_str());
                tracing::warn!(
                    shard = %source.name,
                    cause = cause.as_str(),
                    error = %e,
                    "assignment map refresh failed"
                );
                Err(e)
            }
        }
    }

    async fn read_catalog(
        &self,
        cause: RefreshCause,
        fresh_after: Instant,
        counted: &AtomicBool,
    ) -> Result<(), DbError> {
        let mut last_started = self.catalog_refresh.lock().await;
        if last_started.is_some_and(|started| started >= fresh_after) {
            return Ok(());
        }
        *last_started = Some(Instant::now());
        Self::count(cause, counted);
        let catalog = &self.shards[0];
        match db::read_shard_map(&catalog.pool, self.db_timeout).await {
            Ok(map) => {
                self.set_placement(Placement::from_catalog(map, &self.configured));
                Ok(())
            }
            Err(e) => {
                metrics::record_shard_map_read_failure(catalog.name.as_str());
                tracing::warn!(
                    shard = %catalog.name,
                    cause = cause.as_str(),
                    error = %e,
                    "shard map read failed; keeping the last one"
                );
                Err(e)
            }
        }
    }

    fn set_placement(&self, placement: Placement) {
        {
            let mut current = write_lock(&self.placement);
            if current.same_as(&placement) {
                return;
            }
            match &placement {
                Placement::Refused(reason) => tracing::error!(
                    reason = %reason,
                    "refusing to route by the catalog's shard map; not ready"
                ),
                Placement::Mapped(map) => tracing::info!(
                    shard_map_revision = map.revision,
                    shards = map.shards().len(),
                    "shard map loaded"
                ),
                Placement::Single | Placement::Unread => {}
            }
            metrics::set_shard_map_agrees(placement.problem().is_none());
            *current = placement;
        }
        self.rebuild_view();
    }

    fn install(&self, index: usize, candidate: RoutingMap, cause: RefreshCause) {
        let source = &self.shards[index];
        let before = source.slot.get();
        let revision = candidate.revision();
        let changed = before.as_ref().map_or(candidate.map.partitions.len(), |b| {
            candidate.changed_partitions(b)
        });
        match source.slot.offer(candidate) {
            Offer::Accepted { previous } => {
                metrics::set_shard_assignment_revision(source.name.as_str(), revision);
                if previous != Some(revision) || changed > 0 {
                    tracing::info!(
                        shard = %source.name,
                        cause = cause.as_str(),
                        revision,
                        previous_revision = previous,
                        changed_partitions = changed,
                        "assignment map updated"
                    );
                }
                self.rebuild_view();
            }
            Offer::Stale { current } => {
                tracing::debug!(
                    shard = %source.name,
                    cause = cause.as_str(),
                    revision,
                    current_revision = current,
                    "ignored an older assignment map read"
                );
            }
        }
    }

    /// Compose the view from the placement and every slot, holding the view's write lock
    /// throughout: two rebuilds racing cannot install an older combination over a newer one.
    fn rebuild_view(&self) {
        let mut view = write_lock(&self.view);
        let placement = read_lock(&self.placement).clone();
        let slots = self.shards.iter().map(|s| s.slot.get()).collect();
        *view = ClusterMap::compose(&placement, slots).map(Arc::new);
        if let Some(map) = view.as_ref() {
            metrics::set_assignment_revision(map.revision());
        }
    }
}

fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
