//! The run's view of its shards at the end: a client of every shard with the partitions the
//! catalog's map gives it, and the names under which a shard's own records appear run-wide.
//!
//! Every shard records its streams in its own tables (`ledger_positions`,
//! `event_relay_progress`, `settlement_runs`): a partition's stream counts from the shard that
//! holds the partition now (a source keeps the rows of a partition that moved away), and a
//! shard's settlement stream is `settlement` on the catalog and `settlement/<shard>` elsewhere.
//! A one-database cluster is one shard, `main`, its own catalog with every partition, so all of
//! this reduces to what the tables say.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::check::shards::run_stream_name;

/// One shard at the end of the run.
pub struct ShardDb {
    pub name: String,
    pub client: tokio_postgres::Client,
    /// The first shard, holding the map and the plain `settlement` stream.
    pub catalog: bool,
    /// The partitions the catalog's map gives it.
    pub partitions: Vec<i32>,
}

impl ShardDb {
    /// The run-wide name of the stream this shard records as `stored`, or `None` when it is a
    /// partition the shard no longer holds.
    pub fn stream_name(&self, stored: &str) -> Option<String> {
        let holds = |p: i64| i32::try_from(p).is_ok_and(|p| self.partitions.contains(&p));
        run_stream_name(&self.name, self.catalog, holds, stored)
    }

    /// `query`'s rows (`stream`, integer) as a JSON object, each stream under its run-wide name.
    pub async fn by_stream(&self, query: &str) -> Result<BTreeMap<String, i64>> {
        let text: String = self
            .client
            .query_one(
                &format!(
                    "SELECT coalesce(json_object_agg(stream, n), '{{}}'::json)::text
                       FROM ({query}) q (stream, n) WHERE n IS NOT NULL"
                ),
                &[],
            )
            .await
            .with_context(|| format!("reading streams on shard {}", self.name))?
            .get(0);
        let v: Value = serde_json::from_str(&text)?;
        let mut out = BTreeMap::new();
        for (stored, n) in v.as_object().into_iter().flatten() {
            if let (Some(name), Some(n)) = (self.stream_name(stored), n.as_i64()) {
                out.insert(name, n);
            }
        }
        Ok(out)
    }
}

/// `by_stream` over every shard, merged (every stream belongs to one shard).
pub async fn by_stream(shards: &[ShardDb], query: &str) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for shard in shards {
        out.extend(shard.by_stream(query).await?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::run_stream_name;

    #[test]
    fn a_shard_names_its_settlement_stream_and_only_its_partitions() {
        let s1 = |stored| run_stream_name("s1", false, |p| [8, 9].contains(&p), stored);
        assert_eq!(s1("partition/8").as_deref(), Some("partition/8"));
        assert_eq!(s1("partition/3"), None);
        assert_eq!(s1("settlement").as_deref(), Some("settlement/s1"));
        assert_eq!(s1("settlement/s1").as_deref(), Some("settlement/s1"));
        let main = |stored| run_stream_name("main", true, |p| [0, 1].contains(&p), stored);
        assert_eq!(main("settlement").as_deref(), Some("settlement"));
        assert_eq!(main("partition/1").as_deref(), Some("partition/1"));
    }
}
