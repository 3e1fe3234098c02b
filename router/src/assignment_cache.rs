//! The router's cached partition → owner map, ordered by assignment revision.
//!
//! PostgreSQL's lease table is the only truth (DESIGN.md §4). The cache is a copy that is
//! replaced wholesale by a newer read; it is never patched from hints or from an allocator's
//! `421` body, because those are only signals that a re-read is due.
//!
//! **Shards.** Every shard's lease table holds only its own partitions and takes revisions from
//! its own sequence, so each shard has a [`MapSlot`] of its own, ordered by that shard's revision
//! and read order; revisions of two shards are never compared. Which shard holds a partition is
//! the catalog's shard map (read from the first shard with every full refresh; a failed read
//! keeps the last one), and a request is routed by the slot of its partition's shard
//! ([`ClusterMap`]). A catalog map naming other shards than the configured ones (names, order) is
//! logged and routes nothing: the router is not ready until the two agree. One shard is the
//! special case of all of this that behaves as a router of one database always did.
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
//! accepts one from the last 100 ms. So each database sees at most one map query at a time per
//! router, however many requests fail together. The rule is kept per shard, and for the catalog
//! read on its own (so the catalog database may see its shard-map read next to its own map read,
//! two at most): shards are read concurrently, each within `db_timeout`, and a slow or failed
//! shard neither delays installing the others' reads nor makes a caller that only needs another
//! shard ([`AssignmentCache::refresh_partition`]) wait for it.

use std::sync::{Arc, RwLock};

use schema::wire::{PartitionAssignment, PartitionMap};

mod cache;
mod view;

pub use cache::AssignmentCache;
pub use view::{ClusterMap, Placement};

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
    pub(crate) fn changed_partitions(&self, older: &RoutingMap) -> usize {
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
