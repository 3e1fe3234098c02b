//! The router's cached partition → owner map, ordered by assignment revision.
//!
//! PostgreSQL's lease table is the only truth (DESIGN.md §4). The cache is a copy that is
//! replaced wholesale by a newer read; it is never patched from hints or from an allocator's
//! `421` body, because those are only signals that a re-read is due.
//!
//! **Monotonicity.** Reads can complete out of order (a slow read started before a fast one), so a
//! read only replaces the current map if it is newer: a higher map revision, or the same revision
//! from a read that *started* later. The second rule matters because a lease expiring changes the
//! map (the owner disappears) without taking a new revision; the later read has seen more.
//! [`MapSlot::offer`] implements the rule and is unit-tested on its own.
//!
//! **Coalescing.** Many requests can hit the same stale entry at once (every request to a crashed
//! owner fails). [`AssignmentCache::refresh`] lets one caller read while the others wait, and a
//! waiter is satisfied by any read that started after the point in time it asks for
//! (`fresh_after`): a `421` asks for a read started after the `421` arrived; a connect error
//! accepts one from the last 100 ms. So PostgreSQL sees at most one map query at a time per
//! router, however many requests fail together.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use schema::wire::{PartitionAssignment, PartitionMap};
use tokio::sync::Mutex;

use crate::db::{self, DbError};
use crate::metrics::{self, RefreshCause};

/// Where to send a request for one partition, as of one map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub partition: u32,
    pub owner_id: String,
    pub owner_url: String,
    /// Sent as `X-Expected-Epoch`; an owner at another epoch answers `421`.
    pub epoch: i64,
    /// Sent as `X-Assignment-Revision`: the revision of the whole map routed by.
    pub map_revision: i64,
}

/// One read of the map, stamped with the order in which reads started.
#[derive(Debug, Clone)]
pub struct RoutingMap {
    pub map: PartitionMap,
    /// Increases with every read started by this router; orders reads of equal revision.
    pub read_seq: u64,
}

impl RoutingMap {
    pub fn revision(&self) -> i64 {
        self.map.revision
    }

    pub fn partition_count(&self) -> u32 {
        self.map.partition_count
    }

    pub fn entry(&self, partition: u32) -> Option<&PartitionAssignment> {
        // `read_map` orders by partition, so the index normally is the partition; search if not.
        match self.map.partitions.get(partition as usize) {
            Some(e) if e.partition == partition => Some(e),
            _ => self
                .map
                .partitions
                .iter()
                .find(|e| e.partition == partition),
        }
    }

    /// The live owner of `partition`, if any.
    pub fn destination(&self, partition: u32) -> Option<Destination> {
        let entry = self.entry(partition)?;
        match (&entry.owner_id, &entry.owner_url) {
            (Some(owner_id), Some(owner_url)) => Some(Destination {
                partition,
                owner_id: owner_id.clone(),
                owner_url: owner_url.trim_end_matches('/').to_owned(),
                epoch: entry.epoch,
                map_revision: self.map.revision,
            }),
            _ => None,
        }
    }

    /// Whether this read should replace `current` (strictly newer in (revision, read order)).
    pub fn supersedes(&self, current: &RoutingMap) -> bool {
        (self.map.revision, self.read_seq) > (current.map.revision, current.read_seq)
    }

    /// Partitions whose owner or epoch differ between two maps (for logs).
    fn changed_partitions(&self, older: &RoutingMap) -> usize {
        self.map
            .partitions
            .iter()
            .filter(|e| {
                older.entry(e.partition).is_none_or(|o| {
                    o.owner_id != e.owner_id || o.epoch != e.epoch || o.owner_url != e.owner_url
                })
            })
            .count()
    }
}

/// Result of offering a read to the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Installed; carries the revision it replaced (`None` for the first map).
    Accepted { previous: Option<i64> },
    /// Refused because the current map is newer.
    Stale { current: i64 },
}

/// Holds the current map and enforces monotonicity; no I/O.
#[derive(Debug, Default)]
pub struct MapSlot {
    current: RwLock<Option<Arc<RoutingMap>>>,
}

impl MapSlot {
    pub fn get(&self) -> Option<Arc<RoutingMap>> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Install `candidate` if it supersedes the current map.
    pub fn offer(&self, candidate: RoutingMap) -> Offer {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match current.as_ref() {
            Some(existing) if !candidate.supersedes(existing) => Offer::Stale {
                current: existing.revision(),
            },
            existing => {
                let previous = existing.map(|e| e.revision());
                *current = Some(Arc::new(candidate));
                Offer::Accepted { previous }
            }
        }
    }
}

/// The map cache with its PostgreSQL source.
pub struct AssignmentCache {
    slot: MapSlot,
    pool: Pool,
    /// Bound on one map read.
    db_timeout: Duration,
    /// Held during a read; guards the start time of the latest read attempt, which is what
    /// waiters compare their `fresh_after` with.
    refresh: Mutex<Option<Instant>>,
    read_seq: AtomicU64,
}

impl AssignmentCache {
    pub fn new(pool: Pool, db_timeout: Duration) -> Self {
        AssignmentCache {
            slot: MapSlot::default(),
            pool,
            db_timeout,
            refresh: Mutex::new(None),
            read_seq: AtomicU64::new(0),
        }
    }

    /// The current map; `None` until the first successful read.
    pub fn current(&self) -> Option<Arc<RoutingMap>> {
        self.slot.get()
    }

    /// Re-read the map from PostgreSQL unless a read started at or after `fresh_after` already
    /// completed (or failed) while this caller waited. Returns the current map afterwards.
    ///
    /// Only the caller that actually read sees a database error; coalesced waiters get the
    /// (possibly stale) current map and carry on with their own retry loop.
    pub async fn refresh(
        &self,
        cause: RefreshCause,
        fresh_after: Instant,
    ) -> Result<Option<Arc<RoutingMap>>, DbError> {
        let mut last_started = self.refresh.lock().await;
        if last_started.is_some_and(|started| started >= fresh_after) {
            return Ok(self.current());
        }
        let started = Instant::now();
        *last_started = Some(started);
        let read_seq = self.read_seq.fetch_add(1, Ordering::Relaxed) + 1;
        metrics::record_map_refresh(cause);
        let map = match db::read_map(&self.pool, self.db_timeout).await {
            Ok(map) => map,
            Err(e) => {
                metrics::record_map_refresh_failure(cause);
                tracing::warn!(cause = cause.as_str(), error = %e, "assignment map refresh failed");
                return Err(e);
            }
        };
        // Installed while still holding the lock, so a waiter satisfied by this read sees it.
        self.install(RoutingMap { map, read_seq }, cause);
        drop(last_started);
        Ok(self.current())
    }

    fn install(&self, candidate: RoutingMap, cause: RefreshCause) {
        let before = self.current();
        let revision = candidate.revision();
        let changed = before.as_ref().map_or(candidate.map.partitions.len(), |b| {
            candidate.changed_partitions(b)
        });
        match self.slot.offer(candidate) {
            Offer::Accepted { previous } => {
                metrics::set_assignment_revision(revision);
                if previous != Some(revision) || changed > 0 {
                    tracing::info!(
                        cause = cause.as_str(),
                        revision,
                        previous_revision = previous,
                        changed_partitions = changed,
                        "assignment map updated"
                    );
                }
            }
            Offer::Stale { current } => {
                tracing::debug!(
                    cause = cause.as_str(),
                    revision,
                    current_revision = current,
                    "ignored an older assignment map read"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(revision: i64, read_seq: u64, owners: &[(Option<&str>, i64)]) -> RoutingMap {
        RoutingMap {
            map: PartitionMap {
                partition_count: owners.len() as u32,
                revision,
                partitions: owners
                    .iter()
                    .enumerate()
                    .map(|(i, (owner, epoch))| PartitionAssignment {
                        partition: i as u32,
                        owner_id: owner.map(str::to_owned),
                        owner_url: owner.map(|o| format!("http://{o}/")),
                        epoch: *epoch,
                        revision,
                        lease_remaining_ms: owner.map(|_| 1000),
                    })
                    .collect(),
            },
            read_seq,
        }
    }

    #[test]
    fn first_map_is_accepted() {
        let slot = MapSlot::default();
        assert!(slot.get().is_none());
        assert_eq!(
            slot.offer(map(3, 1, &[(Some("a"), 1)])),
            Offer::Accepted { previous: None }
        );
        assert_eq!(slot.get().unwrap().revision(), 3);
    }

    #[test]
    fn older_revision_never_replaces_newer() {
        let slot = MapSlot::default();
        slot.offer(map(10, 2, &[(Some("b"), 2)]));
        // A read that started later but saw an older revision (cannot happen with one database,
        // but a lagging replica or a reordered completion must not move us backwards).
        assert_eq!(
            slot.offer(map(9, 3, &[(Some("a"), 1)])),
            Offer::Stale { current: 10 }
        );
        assert_eq!(slot.get().unwrap().destination(0).unwrap().owner_id, "b");
        // A read that started earlier with an older revision also loses.
        assert_eq!(
            slot.offer(map(9, 1, &[(Some("a"), 1)])),
            Offer::Stale { current: 10 }
        );
        assert_eq!(
            slot.offer(map(11, 4, &[(Some("c"), 3)])),
            Offer::Accepted { previous: Some(10) }
        );
        assert_eq!(slot.get().unwrap().destination(0).unwrap().owner_id, "c");
    }

    #[test]
    fn equal_revision_is_ordered_by_read_start() {
        let slot = MapSlot::default();
        // Read 2 saw the lease still live; read 3 saw it expired (no new revision on expiry).
        slot.offer(map(5, 2, &[(Some("a"), 1)]));
        assert_eq!(
            slot.offer(map(5, 3, &[(None, 1)])),
            Offer::Accepted { previous: Some(5) }
        );
        assert!(slot.get().unwrap().destination(0).is_none());
        // Read 1 completing late must not resurrect the expired owner.
        assert_eq!(
            slot.offer(map(5, 1, &[(Some("a"), 1)])),
            Offer::Stale { current: 5 }
        );
        assert!(slot.get().unwrap().destination(0).is_none());
        // Re-offering the same read is not "newer" either.
        assert_eq!(
            slot.offer(map(5, 3, &[(Some("a"), 1)])),
            Offer::Stale { current: 5 }
        );
    }

    #[test]
    fn destination_names_live_owner_with_epoch_and_map_revision() {
        let m = map(7, 1, &[(Some("a"), 4), (None, 2)]);
        let r = m.destination(0).unwrap();
        assert_eq!(r.owner_id, "a");
        assert_eq!(r.owner_url, "http://a");
        assert_eq!(r.epoch, 4);
        assert_eq!(r.map_revision, 7);
        assert!(m.destination(1).is_none());
        assert!(m.destination(2).is_none());
    }

    #[test]
    fn changed_partitions_counts_owner_and_epoch_moves() {
        let a = map(1, 1, &[(Some("a"), 1), (Some("b"), 1), (Some("c"), 1)]);
        let b = map(2, 2, &[(Some("a"), 1), (Some("a"), 2), (None, 1)]);
        assert_eq!(b.changed_partitions(&a), 2);
    }
}
