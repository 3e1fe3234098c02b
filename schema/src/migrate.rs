//! Versioned SQL migrations for the fenced inventory allocator.
//!
//! Migrations live in `schema/migrations/` as `V<n>__<name>.sql`, are embedded into the binary by
//! refinery, and are applied under a PostgreSQL advisory lock so that several replicas started at
//! the same moment serialise instead of racing on `CREATE TABLE`. Under the same lock, right
//! after the migrations, the stored functions kept whole in `schema/functions/` are installed
//! where the database does not hold their revision yet ([`crate::functions`]).
//!
//! [`initialise`] also fixes the cluster's partition count the first time it runs and creates one
//! lease row per partition; later runs verify the count instead of changing it, because every
//! inventory row stores its partition. [`initialise_with`] also sets the span of the ledger's
//! time partitions (V17): for the partitions the migration creates, and for those created after
//! the last existing one on a cluster that has them.

use std::time::Duration;

use tokio_postgres::Client;

pub use crate::error::SchemaError;
use crate::functions::{self, FunctionReport};
use crate::shard::{self, ShardError, ShardMap, ShardName};

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Application-chosen advisory lock key ("FENCEDMG" as bytes); any constant shared by every
/// replica works, it only has to be stable across releases.
const MIGRATION_LOCK_KEY: i64 = 0x4645_4E43_4544_4D47;

/// Name of the singleton settlement job lease.
pub const SETTLEMENT_LEASE: &str = "job/settlement";

/// Partition count of a new cluster when none is given.
pub const DEFAULT_PARTITIONS: u32 = 64;

pub use crate::partition::MAX_PARTITIONS;

/// What [`initialise_with`] sets up.
#[derive(Debug, Clone, Default)]
pub struct InitOptions {
    /// Partition count for a new cluster; `None`: the existing one, or 64.
    pub partitions: Option<u32>,
    /// Span of each ledger time partition; `None`: the existing one, or 1 day.
    pub ledger_partition_span: Option<Duration>,
    /// Which shard this database is; `None`: the one it already is, or, for a new database, the
    /// one shard [`crate::shard::DEFAULT_SHARD`] holding every partition, its own catalog.
    pub shard: Option<ShardRole>,
}

/// A database's place in a cluster of several shards (`allocator migrate --shard`).
#[derive(Debug, Clone)]
pub struct ShardRole {
    pub name: ShardName,
    /// The catalog's map; the shard's partitions are those it names for `name`.
    pub map: ShardMap,
    /// Whether this database is the catalog (it then stores `map`).
    pub catalog: bool,
}

/// What [`initialise`] did, for the operator's log.
#[derive(Debug, Clone)]
pub struct MigrationReport {
    pub applied: Vec<String>,
    /// Every function file, and whether this run installed it.
    pub functions: Vec<FunctionReport>,
    pub partition_count: u32,
    pub created_cluster: bool,
}

/// Apply pending migrations and fix the partition count, all under one advisory lock.
///
/// `requested_partitions` of `None` means "whatever the cluster already has, or the default of 64
/// for a new cluster".
pub async fn initialise(
    client: &mut Client,
    requested_partitions: Option<u32>,
) -> Result<MigrationReport, SchemaError> {
    initialise_with(
        client,
        InitOptions {
            partitions: requested_partitions,
            ..InitOptions::default()
        },
    )
    .await
}

/// [`initialise`] with the ledger's partition span.
pub async fn initialise_with(
    client: &mut Client,
    options: InitOptions,
) -> Result<MigrationReport, SchemaError> {
    let requested_partitions = options.partitions;
    let span = match options.ledger_partition_span {
        Some(span) if span.subsec_nanos() != 0 || span.as_secs() == 0 => {
            return Err(SchemaError::InvalidLedgerSpan)
        }
        span => span.map(|s| s.as_secs() as i64),
    };
    if let Some(p) = requested_partitions {
        if p == 0 || p > MAX_PARTITIONS {
            return Err(SchemaError::InvalidPartitionCount(p));
        }
    }
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    let result = initialise_locked(client, requested_partitions, span, options.shard).await;
    // Unlock even when migrating failed; the session ending would also release it.
    let unlock = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await;
    let report = result?;
    unlock?;
    Ok(report)
}

async fn initialise_locked(
    client: &mut Client,
    requested_partitions: Option<u32>,
    ledger_span_secs: Option<i64>,
    shard_role: Option<ShardRole>,
) -> Result<MigrationReport, SchemaError> {
    // V17 reads the span of the partitions it creates from this session setting.
    if let Some(secs) = ledger_span_secs {
        client
            .execute(
                "SELECT set_config('allocator.ledger_partition_span', $1, false)",
                &[&format!("{secs} seconds")],
            )
            .await?;
    }
    let report = embedded::migrations::runner()
        .set_abort_divergent(true)
        .run_async(client)
        .await?;
    let applied = report
        .applied_migrations()
        .iter()
        .map(|m| m.to_string())
        .collect();
    // After every migration, which may still hold a function's earlier text (V2..V28 do).
    let functions = functions::install(client).await?;

    let existing = read_partition_count(client).await?;
    let (partition_count, created_cluster) = match (existing, requested_partitions) {
        (Some(existing), Some(requested)) if existing != requested => {
            return Err(SchemaError::PartitionCountMismatch {
                existing,
                requested,
            })
        }
        (Some(existing), _) => (existing, false),
        (None, requested) => {
            let p = requested.unwrap_or(DEFAULT_PARTITIONS);
            client
                .execute(
                    "INSERT INTO cluster_settings (partition_count) VALUES ($1)",
                    &[&(p as i32)],
                )
                .await?;
            (p, true)
        }
    };
    settle_shard_record(client, partition_count, shard_role).await?;
    client
        .execute(
            "INSERT INTO leases (name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
            &[&SETTLEMENT_LEASE],
        )
        .await?;
    // Each partition's ledger position counter and relay progress (V12, V13): written by the
    // fenced batch and the relay, which only update them.
    client
        .batch_execute(
            "INSERT INTO ledger_positions (partition, last_position)
             SELECT partition, 0 FROM leases WHERE partition IS NOT NULL
             ON CONFLICT (partition) DO NOTHING;
             INSERT INTO event_relay_progress (stream)
             SELECT 'partition/' || partition FROM leases WHERE partition IS NOT NULL
             UNION ALL SELECT 'settlement'
             ON CONFLICT (stream) DO NOTHING;",
        )
        .await?;
    // A new span applies from the end of the last partition on; then partitions ahead of now.
    if let Some(secs) = ledger_span_secs {
        client
            .execute(
                "UPDATE ledger_partitioning SET span = $1::bigint * interval '1 second'
                  WHERE span <> $1::bigint * interval '1 second'",
                &[&secs],
            )
            .await?;
    }
    client
        .execute("SELECT ledger_ensure_partitions()", &[])
        .await?;
    Ok(MigrationReport {
        applied,
        functions,
        partition_count,
        created_cluster,
    })
}

/// Give a new database its shard record and the lease rows of its partitions (the catalog also
/// its map), or check an existing record against the role it is migrated as. Either way the
/// record must then agree with the map: a database already holding lease rows of partitions the
/// map places elsewhere (a one-database cluster migrated as one of several shards) is refused.
async fn settle_shard_record(
    client: &mut Client,
    partition_count: u32,
    role: Option<ShardRole>,
) -> Result<(), SchemaError> {
    let existing = shard::store::read_record(&*client).await?;
    let role = match (existing, role) {
        (Some(_), None) => return Ok(()),
        (Some(record), Some(role)) if record.shard != role.name => {
            return Err(ShardError::NameMismatch {
                configured: role.name.to_string(),
                found: record.shard.to_string(),
            }
            .into())
        }
        (existing, role) => (
            existing.is_none(),
            role.unwrap_or(ShardRole {
                name: ShardName::default_shard(),
                map: ShardMap::plan(vec![ShardName::default_shard()], partition_count)?,
                catalog: true,
            }),
        ),
    };
    let (create, role) = role;
    if role.map.partition_count() != partition_count {
        return Err(SchemaError::PartitionCountMismatch {
            existing: partition_count,
            requested: role.map.partition_count(),
        });
    }
    // One transaction: a new record that would disagree with the map is never committed.
    let tx = client.transaction().await?;
    if create {
        let partitions = role.map.partitions_of(&role.name);
        shard::store::create_record(&tx, &role.name, role.catalog, &partitions).await?;
        if role.catalog {
            shard::store::create_map(&tx, &role.map).await?;
        }
    }
    let record = shard::store::read_record(&tx)
        .await?
        .ok_or(SchemaError::NotInitialised)?;
    role.map.check_record(&record)?;
    if role.catalog {
        if let Some(stored) = shard::store::read_map(&tx).await? {
            stored.check_shards(role.map.shards())?;
        }
    }
    tx.commit().await?;
    Ok(())
}

async fn read_partition_count(client: &Client) -> Result<Option<u32>, SchemaError> {
    let row = client
        .query_opt("SELECT partition_count FROM cluster_settings", &[])
        .await?;
    Ok(row.map(|r| r.get::<_, i32>(0) as u32))
}

/// The cluster's partition count; fails when `allocator migrate` has not run yet.
pub async fn partition_count<C: tokio_postgres::GenericClient>(
    client: &C,
) -> Result<u32, SchemaError> {
    match client
        .query_opt(
            "SELECT partition_count FROM cluster_settings WHERE EXISTS \
             (SELECT 1 FROM pg_tables WHERE tablename = 'cluster_settings')",
            &[],
        )
        .await
    {
        Ok(Some(row)) => Ok(row.get::<_, i32>(0) as u32),
        Ok(None) => Err(SchemaError::NotInitialised),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
            Err(SchemaError::NotInitialised)
        }
        Err(e) => Err(e.into()),
    }
}
