//! A cluster over several PostgreSQL primaries (DESIGN.md §12): the cluster's own database is
//! shard `s0` and the catalog; each further shard is a private [`PgServer`] of its own, so a test
//! can stop, freeze or cut off one shard while the others serve.
//!
//! Allocators are spread over the shards by their place in the cluster (allocator `i` serves shard
//! `i mod S`, and a restart under the same id keeps its shard); routers are given every shard.

use anyhow::{bail, Context, Result};
use schema::wire::PartitionMap;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::Cluster;
use crate::PgServer;

/// One shard beyond the cluster's own database.
#[derive(Debug)]
pub struct ExtraShard {
    pub name: String,
    pub url: String,
    pub server: PgServer,
}

/// The environment variable that spreads the clusters of a test suite that honours it over that
/// many shards ([`shards_from_env`]); the router's integration suite does, so the same tests run
/// over one database and over several (`ops/test.sh --shards 2`).
pub const SHARDS_ENV: &str = "TESTKIT_SHARDS";

/// [`SHARDS_ENV`] as a shard count: 1 when unset; a value that is not a count of at least 1 is
/// refused loudly rather than ignored, since the suite would then test something else.
pub fn shards_from_env() -> usize {
    match std::env::var(SHARDS_ENV) {
        Err(_) => 1,
        Ok(value) => match value.trim().parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => panic!("{SHARDS_ENV}={value:?}: give a shard count of at least 1"),
        },
    }
}

/// The name of shard `index` in a cluster of several.
pub fn shard_name(index: usize) -> String {
    format!("s{index}")
}

impl Cluster {
    /// How many shards the cluster has (1: its one database, the default shard `main`).
    pub fn shard_count(&self) -> usize {
        1 + self.extra_shards.len()
    }

    /// `(name, url)` of every shard, the catalog first; empty for a one-database cluster, whose
    /// services are started without shard flags.
    pub fn shard_urls(&self) -> Vec<(String, String)> {
        if self.extra_shards.is_empty() {
            return Vec::new();
        }
        std::iter::once((shard_name(0), self.db_url.clone()))
            .chain(
                self.extra_shards
                    .iter()
                    .map(|s| (s.name.clone(), s.url.clone())),
            )
            .collect()
    }

    /// `--shard NAME=URL` for every shard (the catalog first), for `migrate` and routers.
    pub fn shard_args(&self) -> Vec<String> {
        self.shard_urls()
            .into_iter()
            .flat_map(|(name, url)| ["--shard".to_owned(), format!("{name}={url}")])
            .collect()
    }

    /// The shard allocator `id` serves: its place among the allocators (the next place for a
    /// new id), modulo the shard count.
    pub fn allocator_shard(&self, id: &str) -> usize {
        let place = self
            .allocators
            .iter()
            .position(|a| a.id == id)
            .unwrap_or(self.allocators.len());
        place % self.shard_count()
    }

    /// The extra shard `index` (1 or more); shard 0 is the cluster's own database.
    pub fn shard_mut(&mut self, index: usize) -> Result<&mut ExtraShard> {
        match index
            .checked_sub(1)
            .and_then(|i| self.extra_shards.get_mut(i))
        {
            Some(shard) => Ok(shard),
            None => bail!("the cluster has no extra shard {index}"),
        }
    }

    /// A client of shard `index` (0: [`Cluster::db`]).
    pub async fn shard_db(&self, index: usize) -> Result<tokio_postgres::Client> {
        match index {
            0 => self.db().await,
            i => match self.extra_shards.get(i - 1) {
                Some(shard) => super::connect(&shard.url).await,
                None => bail!("the cluster has no shard {index}"),
            },
        }
    }

    /// `sql` on every shard, the rows one after another (the catalog's first): what a test of one
    /// database reads from "the database", over a cluster of several.
    pub async fn query_every_shard(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        for shard in 0..self.shard_count() {
            let db = self.shard_db(shard).await?;
            rows.extend(
                db.query(sql, params)
                    .await
                    .with_context(|| format!("{sql} on shard {shard}"))?,
            );
        }
        Ok(rows)
    }

    /// The first column (a `bigint`) of `sql`'s one row, summed over every shard: a count or a
    /// sum of one database, over a cluster of several.
    pub async fn sum_every_shard(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<i64> {
        let rows = self.query_every_shard(sql, params).await?;
        Ok(rows.iter().map(|row| row.get::<_, i64>(0)).sum())
    }

    /// The partition map as the shards have it now, merged (each partition from its shard).
    pub async fn map(&self) -> Result<PartitionMap> {
        let mut map = schema::assignment::read_map(&self.db().await?).await?;
        for shard in 1..self.shard_count() {
            let part = schema::assignment::read_map(&self.shard_db(shard).await?).await?;
            map.revision = map.revision.max(part.revision);
            map.partitions.extend(part.partitions);
        }
        map.partitions.sort_by_key(|p| p.partition);
        Ok(map)
    }
}
