//! Reading and writing the shard records (V23): a shard's own record, and the catalog's map.

use tokio_postgres::GenericClient;

use super::{ShardMap, ShardName, ShardRecord};
use crate::error::SchemaError;

fn name(raw: String) -> Result<ShardName, SchemaError> {
    raw.parse().map_err(SchemaError::Shard)
}

/// This database's own record, or `None` before `allocator migrate` gave it one. A lease row a
/// move is still bringing in (`moving_in`, V28) is not yet one of its partitions.
pub async fn read_record<C: GenericClient>(client: &C) -> Result<Option<ShardRecord>, SchemaError> {
    let row = client
        .query_opt(
            "SELECT shard, catalog,
                    (SELECT coalesce(array_agg(partition ORDER BY partition), '{}')
                       FROM leases WHERE partition IS NOT NULL AND NOT moving_in)
               FROM shard_identity",
            &[],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let partitions: Vec<i32> = row.get(2);
    Ok(Some(ShardRecord {
        shard: name(row.get(0))?,
        catalog: row.get(1),
        partitions: partitions.into_iter().map(|p| p as u32).collect(),
    }))
}

/// The catalog's shard map, or `None` when this database holds none (it is not the catalog, or
/// `allocator migrate` has not run).
pub async fn read_map<C: GenericClient>(client: &C) -> Result<Option<ShardMap>, SchemaError> {
    let shards = client
        .query("SELECT shard FROM shards ORDER BY ordinal", &[])
        .await?;
    if shards.is_empty() {
        return Ok(None);
    }
    let shards = shards
        .into_iter()
        .map(|r| name(r.get(0)))
        .collect::<Result<Vec<_>, _>>()?;
    let rows = client
        .query(
            "SELECT partition, shard, revision FROM shard_map ORDER BY partition",
            &[],
        )
        .await?;
    let count: i32 = client
        .query_one("SELECT partition_count FROM cluster_settings", &[])
        .await?
        .get(0);
    let count = count as u32;
    let revision = rows.iter().map(|r| r.get::<_, i64>(2)).max().unwrap_or(0);
    let rows = rows
        .into_iter()
        .map(|r| Ok((r.get::<_, i32>(0) as u32, name(r.get(1))?)))
        .collect::<Result<Vec<_>, SchemaError>>()?;
    Ok(Some(
        ShardMap::from_rows(shards, &rows, count, revision).map_err(SchemaError::Shard)?,
    ))
}

/// [`read_map`], or `None` on a database the migrations have not reached yet (no V23 tables).
pub async fn read_map_if_migrated<C: GenericClient>(
    client: &C,
) -> Result<Option<ShardMap>, SchemaError> {
    match read_map(client).await {
        Err(SchemaError::Database(e))
            if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) =>
        {
            Ok(None)
        }
        other => other,
    }
}

/// Adds `shards` to the catalog after its own, holding no partition.
pub async fn add_shards<C: GenericClient>(
    client: &C,
    shards: &[ShardName],
) -> Result<(), SchemaError> {
    let names: Vec<&str> = shards.iter().map(ShardName::as_str).collect();
    client
        .execute(
            "INSERT INTO shards (shard, ordinal)
             SELECT s, (SELECT coalesce(max(ordinal), -1) FROM shards) + o::int
               FROM unnest($1::text[]) WITH ORDINALITY AS t(s, o)",
            &[&names],
        )
        .await?;
    Ok(())
}

/// Give a new shard its record and the lease rows of its partitions.
pub(crate) async fn create_record<C: GenericClient>(
    client: &C,
    shard: &ShardName,
    catalog: bool,
    partitions: &[u32],
) -> Result<(), SchemaError> {
    let partitions: Vec<i32> = partitions.iter().map(|p| *p as i32).collect();
    client
        .execute(
            "INSERT INTO shard_identity (shard, catalog) VALUES ($1, $2)",
            &[&shard.as_str(), &catalog],
        )
        .await?;
    client
        .execute(
            "INSERT INTO leases (name, partition)
             SELECT 'partition/' || p, p FROM unnest($1::int[]) AS p
             ON CONFLICT (name) DO NOTHING",
            &[&partitions],
        )
        .await?;
    Ok(())
}

/// Write a new catalog's map (every row under one new revision).
pub(crate) async fn create_map<C: GenericClient>(
    client: &C,
    map: &ShardMap,
) -> Result<(), SchemaError> {
    let names: Vec<&str> = map.shards().iter().map(ShardName::as_str).collect();
    client
        .execute(
            "INSERT INTO shards (shard, ordinal)
             SELECT s, o::int - 1 FROM unnest($1::text[]) WITH ORDINALITY AS t(s, o)",
            &[&names],
        )
        .await?;
    let holders: Vec<&str> = (0..map.partition_count())
        .map(|p| names[map.shard_index(p).unwrap_or(0)])
        .collect();
    client
        .execute(
            "WITH r AS (SELECT nextval('shard_map_revision') AS revision)
             INSERT INTO shard_map (partition, shard, revision)
             SELECT o::int - 1, s, r.revision
               FROM unnest($1::text[]) WITH ORDINALITY AS t(s, o), r",
            &[&holders],
        )
        .await?;
    Ok(())
}

/// Whether this database's own record holds `partition` (its lease row is here): only then may
/// it answer for the partition's rows. A shard a partition moved away from keeps a frozen copy
/// of them but not the lease row (DESIGN.md §12), so its copy is never served.
pub async fn holds_partition<C: GenericClient>(
    client: &C,
    partition: u32,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM leases WHERE partition = $1)",
            &[&(partition as i32)],
        )
        .await?
        .get(0))
}
