//! Shards: which PostgreSQL primary holds each partition.
//!
//! A partition never needs a transaction with another (a fenced batch touches one partition
//! group's lease, inventory, reservations and ledger; an order spans partitions through
//! compensation), so the partition is the unit placed on a shard. Each shard is a primary with its
//! own lease rows, so the epoch fence stays on the database that holds the data.
//!
//! Two records say where a partition lives, and they must agree:
//! - the **shard map** in the catalog database (the first shard): the shards in order, and the
//!   shard of every partition, under a revision ([`ShardMap`]);
//! - each shard's **own record** ([`ShardRecord`]): its name and the partitions whose lease rows
//!   it holds. A lease row is what an owner fences on, so a partition's rows on a shard the map
//!   does not name for it could be written by a second owner; every service therefore refuses to
//!   start on a map that disagrees with a shard's record ([`ShardMap::check_record`]).
//!
//! One database is the default: a shard named [`DEFAULT_SHARD`] holding every partition, its own
//! catalog.

use std::fmt;
use std::str::FromStr;

use crate::partition::stable_hash;

#[cfg(feature = "postgres")]
pub mod store;

/// The shard of a one-database cluster.
pub const DEFAULT_SHARD: &str = "main";

/// Why a shard name, target or map is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("shard name {0:?} is invalid: 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter or digit")]
    InvalidName(String),
    #[error("shard {0:?} is expected as NAME=URL")]
    InvalidTarget(String),
    #[error("shard {0} is named twice")]
    Duplicate(String),
    #[error("no shards given")]
    Empty,
    #[error("{shards} shards cannot hold {partitions} partitions: every shard needs at least one")]
    TooManyShards { shards: usize, partitions: u32 },
    #[error("the shard map has no entry for partition {0}")]
    Unmapped(u32),
    #[error("the shard map names shard {0}, which is not among its shards")]
    UnknownShard(String),
    #[error(
        "the shard map (revision {revision}) gives shard {shard} partitions {expected:?}, \
         but the shard's database holds {found:?}; refusing to run on a map that disagrees \
         with a shard"
    )]
    RecordMismatch {
        shard: String,
        revision: i64,
        expected: Vec<u32>,
        found: Vec<u32>,
    },
    #[error("the catalog's shards are {catalog:?}, but {configured:?} were configured")]
    ShardsMismatch {
        catalog: Vec<String>,
        configured: Vec<String>,
    },
    #[error("the database is shard {found}, but it was configured as shard {configured}")]
    NameMismatch { configured: String, found: String },
}

/// A shard's name: 1 to 63 of `a-z`, `0-9`, `_`, `-`, starting with a letter or digit (usable
/// as a metric label and in a file name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardName(String);

impl ShardName {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The one shard of a one-database cluster.
    pub fn default_shard() -> Self {
        Self(DEFAULT_SHARD.to_owned())
    }
}

impl FromStr for ShardName {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let valid = (1..=63).contains(&s.len())
            && s.bytes().enumerate().all(|(i, b)| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'_' || b == b'-'))
            });
        if valid {
            Ok(Self(s.to_owned()))
        } else {
            Err(ShardError::InvalidName(s.to_owned()))
        }
    }
}

impl fmt::Display for ShardName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A shard and how to reach it, as given on a command line: `NAME=URL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardTarget {
    pub name: ShardName,
    pub url: String,
}

impl FromStr for ShardTarget {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, url) = s
            .split_once('=')
            .filter(|(_, url)| !url.is_empty())
            .ok_or_else(|| ShardError::InvalidTarget(s.to_owned()))?;
        Ok(Self {
            name: name.parse()?,
            url: url.to_owned(),
        })
    }
}

/// The names of `targets`, refused when empty or when a name repeats.
pub fn target_names(targets: &[ShardTarget]) -> Result<Vec<ShardName>, ShardError> {
    let mut names: Vec<ShardName> = Vec::with_capacity(targets.len());
    for t in targets {
        if names.contains(&t.name) {
            return Err(ShardError::Duplicate(t.name.to_string()));
        }
        names.push(t.name.clone());
    }
    if names.is_empty() {
        return Err(ShardError::Empty);
    }
    Ok(names)
}

/// The shard (index into the configured shards) that stores the order `order_id`: orders span
/// partitions, so they are placed by their own id, the same way by every router.
pub fn order_shard(order_id: &str, shard_count: usize) -> usize {
    (stable_hash(order_id) % shard_count.max(1) as u64) as usize
}

/// A shard's own record: its name, whether it is the catalog, and the partitions whose lease
/// rows it holds (ascending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRecord {
    pub shard: ShardName,
    pub catalog: bool,
    pub partitions: Vec<u32>,
}

/// The catalog's map: the shards in order and the shard of every partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    pub revision: i64,
    shards: Vec<ShardName>,
    /// `holder[p]` is the index in `shards` of the shard holding partition `p`.
    holder: Vec<usize>,
}

impl ShardMap {
    /// The map of a new cluster: `partition_count` partitions in contiguous ranges over `shards`
    /// in order (the first shards take one more when the count does not divide), so an operator
    /// reads "0–7 on a, 8–15 on b".
    pub fn plan(shards: Vec<ShardName>, partition_count: u32) -> Result<Self, ShardError> {
        if shards.is_empty() {
            return Err(ShardError::Empty);
        }
        if shards.len() as u64 > u64::from(partition_count) {
            return Err(ShardError::TooManyShards {
                shards: shards.len(),
                partitions: partition_count,
            });
        }
        let n = shards.len() as u64;
        let holder = (0..u64::from(partition_count))
            .map(|p| (p * n / u64::from(partition_count)) as usize)
            .collect();
        Ok(Self {
            revision: 0,
            shards,
            holder,
        })
    }

    /// A map from the catalog's rows: the shards in ordinal order and `(partition, shard)` rows,
    /// which must cover `0..partition_count` with known shards.
    pub fn from_rows(
        shards: Vec<ShardName>,
        rows: &[(u32, ShardName)],
        partition_count: u32,
        revision: i64,
    ) -> Result<Self, ShardError> {
        let mut holder = vec![usize::MAX; partition_count as usize];
        for (partition, shard) in rows {
            let index = shards
                .iter()
                .position(|s| s == shard)
                .ok_or_else(|| ShardError::UnknownShard(shard.to_string()))?;
            if let Some(slot) = holder.get_mut(*partition as usize) {
                *slot = index;
            }
        }
        if let Some(p) = holder.iter().position(|h| *h == usize::MAX) {
            return Err(ShardError::Unmapped(p as u32));
        }
        Ok(Self {
            revision,
            shards,
            holder,
        })
    }

    pub fn shards(&self) -> &[ShardName] {
        &self.shards
    }

    pub fn partition_count(&self) -> u32 {
        self.holder.len() as u32
    }

    /// The index (in [`ShardMap::shards`]) of the shard holding `partition`.
    pub fn shard_index(&self, partition: u32) -> Option<usize> {
        self.holder.get(partition as usize).copied()
    }

    /// The partitions `shard` holds, ascending.
    pub fn partitions_of(&self, shard: &ShardName) -> Vec<u32> {
        match self.shards.iter().position(|s| s == shard) {
            Some(index) => (0..self.partition_count())
                .filter(|p| self.holder[*p as usize] == index)
                .collect(),
            None => Vec::new(),
        }
    }

    /// Refuse a map that disagrees with a shard's own record of its partitions.
    pub fn check_record(&self, record: &ShardRecord) -> Result<(), ShardError> {
        let expected = self.partitions_of(&record.shard);
        if !self.shards.contains(&record.shard) || expected != record.partitions {
            return Err(ShardError::RecordMismatch {
                shard: record.shard.to_string(),
                revision: self.revision,
                expected,
                found: record.partitions.clone(),
            });
        }
        Ok(())
    }

    /// Refuse a configuration whose shards (names, in order) are not the catalog's.
    pub fn check_shards(&self, configured: &[ShardName]) -> Result<(), ShardError> {
        if self.shards != configured {
            return Err(ShardError::ShardsMismatch {
                catalog: self.shards.iter().map(ToString::to_string).collect(),
                configured: configured.iter().map(ToString::to_string).collect(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
