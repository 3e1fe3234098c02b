//! The map a request is routed by: every shard's latest accepted read, placed by the catalog's
//! shard map.
//!
//! Each shard's read keeps its own revision (revisions of different shards come from different
//! sequences and are never compared); a partition's destination is taken from the read of the
//! shard that holds it. The view is rebuilt whenever a shard's read or the placement changes,
//! and is immutable once built, so a request sees one consistent combination.

use std::sync::Arc;

use schema::shard::{ShardMap, ShardName};
use schema::wire::{PartitionAssignment, PartitionMap};

use super::{Destination, RoutingMap};

/// Which shard holds each partition, as far as routing may rely on it.
#[derive(Debug, Clone)]
pub enum Placement {
    /// The catalog's shard map has not been read yet.
    Unread,
    /// One shard holds every partition: the catalog agrees (a map naming only the configured
    /// shard), or a one-database cluster whose schema predates shard maps.
    Single,
    /// The catalog's map, checked against the configured shards.
    Mapped(Arc<ShardMap>),
    /// Not routable: the catalog's map disagrees with the configuration (or a cluster of several
    /// shards has no map); the reason, for `/readyz` and the logs.
    Refused(String),
}

impl Placement {
    /// The placement a catalog read gives, for `configured` shards.
    pub fn from_catalog(map: Option<ShardMap>, configured: &[ShardName]) -> Placement {
        match map {
            Some(map) => match map.check_shards(configured) {
                Ok(()) if configured.len() == 1 => Placement::Single,
                Ok(()) => Placement::Mapped(Arc::new(map)),
                Err(e) => Placement::Refused(e.to_string()),
            },
            None if configured.len() == 1 => Placement::Single,
            None => Placement::Refused(
                "the catalog (the first shard) holds no shard map: run `allocator migrate` \
                 over every shard"
                    .to_owned(),
            ),
        }
    }

    /// Why routing cannot rely on this placement, if it cannot.
    pub fn problem(&self) -> Option<&str> {
        match self {
            Placement::Unread => Some("the catalog's shard map has not been read yet"),
            Placement::Refused(reason) => Some(reason),
            Placement::Single | Placement::Mapped(_) => None,
        }
    }

    /// Same placement (for logging changes only).
    pub(super) fn same_as(&self, other: &Placement) -> bool {
        match (self, other) {
            (Placement::Unread, Placement::Unread) | (Placement::Single, Placement::Single) => true,
            (Placement::Mapped(a), Placement::Mapped(b)) => a == b,
            (Placement::Refused(a), Placement::Refused(b)) => a == b,
            _ => false,
        }
    }
}

/// The routing view: the placement and each shard's latest accepted read (`None` until the
/// shard's first read succeeds).
#[derive(Debug, Clone)]
pub struct ClusterMap {
    shard_map: Option<Arc<ShardMap>>,
    shards: Vec<Option<Arc<RoutingMap>>>,
}

impl ClusterMap {
    /// The view, or `None` when routing must not happen: the placement is unread or refused, or
    /// no shard has been read yet. A shard not read yet only leaves its own partitions without
    /// an owner.
    pub fn compose(placement: &Placement, shards: Vec<Option<Arc<RoutingMap>>>) -> Option<Self> {
        let shard_map = match placement {
            Placement::Single => None,
            Placement::Mapped(map) => Some(map.clone()),
            Placement::Unread | Placement::Refused(_) => return None,
        };
        if shards.iter().all(Option::is_none) {
            return None;
        }
        Some(ClusterMap { shard_map, shards })
    }

    /// The highest revision over the shards read. Revisions of different shards are not
    /// comparable; this is a summary for people (`X-Assignment-Revision` of `GET
    /// /v1/partitions`, `/readyz`, the revision gauge), exact for a cluster of one shard. What a
    /// request carries is its shard's own revision ([`Destination::map_revision`]).
    pub fn revision(&self) -> i64 {
        self.loaded().map(|(_, m)| m.revision()).max().unwrap_or(0)
    }

    /// The cluster's partition count (every shard's read reports the cluster's total).
    pub fn partition_count(&self) -> u32 {
        match &self.shard_map {
            Some(map) => map.partition_count(),
            None => self
                .loaded()
                .map(|(_, m)| m.partition_count())
                .max()
                .unwrap_or(0),
        }
    }

    /// The index of the shard holding `partition`.
    pub fn shard_of(&self, partition: u32) -> Option<usize> {
        match &self.shard_map {
            Some(map) => map.shard_index(partition),
            None => (partition < self.partition_count()).then_some(0),
        }
    }

    /// Shard `index`'s latest accepted read.
    pub fn shard(&self, index: usize) -> Option<&Arc<RoutingMap>> {
        self.shards.get(index).and_then(Option::as_ref)
    }

    /// How many shards are configured.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// `partition`'s entry in the read of the shard holding it.
    pub fn entry(&self, partition: u32) -> Option<&PartitionAssignment> {
        self.shard(self.shard_of(partition)?)?.entry(partition)
    }

    /// The live owner of `partition`, with its shard's revision.
    pub fn destination(&self, partition: u32) -> Option<Destination> {
        self.shard(self.shard_of(partition)?)?
            .destination(partition)
    }

    /// Every partition's entry in partition order, each from its shard; `revision` is
    /// [`ClusterMap::revision`]. A partition of a shard not read yet is absent.
    pub fn merged(&self) -> PartitionMap {
        let partitions = (0..self.partition_count())
            .filter_map(|p| self.entry(p).cloned())
            .collect();
        PartitionMap {
            partition_count: self.partition_count(),
            revision: self.revision(),
            partitions,
        }
    }

    /// The indexes of the shards not read yet.
    pub fn unread_shards(&self) -> Vec<usize> {
        (0..self.shards.len())
            .filter(|i| self.shards[*i].is_none())
            .collect()
    }

    fn loaded(&self) -> impl Iterator<Item = (usize, &Arc<RoutingMap>)> {
        self.shards
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.as_ref().map(|m| (i, m)))
    }
}

#[cfg(test)]
#[path = "view_tests.rs"]
pub(crate) mod tests;
