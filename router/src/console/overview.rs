//! `GET /v1/cluster/overview`: one read of the cluster for the operations page.
//!
//! The lease map, the replicas and the settlement job are read from PostgreSQL on one pooled
//! connection, within the router's database timeout, because PostgreSQL is the authority on who
//! owns what: the page must show a failover when the database has it, not when this router's
//! cache catches up. The cache's revision is reported next to it (`router_revision`), so a
//! router that lags behind the database is visible too. A database that does not answer is a
//! `503` problem like on every other route.
//!
//! The settlement job is optional in the answer: it is `null` when its status cannot be read
//! (no job row, as in a database from before the job existed), which must not hide the map.
//!
//! With several shards every shard is read concurrently (its lease map and its replicas, each
//! shard's allocators register there), within the one timeout, and merged: partitions in order,
//! replicas by id, `revision` the highest over the shards (not comparable between shards, a
//! summary). Any shard that does not answer makes the page a `503` rather than a map with holes.
//! `settlement` is the catalog shard's job; `shards` lists every shard with the partitions the
//! catalog's map places on it (as this router routes) and its own settlement job, or why that
//! could not be read — each shard runs its own, and one that is stuck must show.

use std::time::Instant;

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::GenericClient;

use super::traffic::{Traffic, TrafficSnapshot};
use crate::db::{self, DbError};
use crate::error::RouterError;
use crate::state::AppState;
use schema::wire::{PartitionAssignment, SettlementStatus, ShardSettlement, ShardSettlementRead};

/// The answer; documented as `ClusterOverview` in the API document.
#[derive(Debug, Serialize)]
pub struct Overview {
    /// Revision of the map this router routes by (its cache); `null` before the first load.
    pub router_revision: Option<i64>,
    pub partition_count: u32,
    /// Highest revision in the database's map.
    pub revision: i64,
    pub partitions: Vec<PartitionAssignment>,
    pub replicas: Vec<Replica>,
    pub settlement: Option<SettlementStatus>,
    /// Every shard, the catalog first.
    pub shards: Vec<ShardOverview>,
    pub traffic: TrafficSnapshot,
}

/// One shard in the overview; documented as `ClusterOverviewShard`.
#[derive(Debug, Serialize)]
pub struct ShardOverview {
    /// Its name and its settlement job, or its name and why the job could not be read.
    #[serde(flatten)]
    pub settlement: ShardSettlement,
    /// The partitions the catalog's map places on it, as this router's cache has the map
    /// (empty before the cache's first load).
    pub partitions: Vec<u32>,
}

/// A registered allocator replica.
#[derive(Debug, Serialize)]
pub struct Replica {
    pub replica_id: String,
    pub advertise_url: String,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// Time since the last heartbeat by the database clock.
    pub heartbeat_age_ms: i64,
    /// Its registration has not expired by the database clock.
    pub alive: bool,
    /// Partitions it holds an unexpired lease on.
    pub partitions_owned: u32,
}

pub async fn overview(
    state: web::Data<AppState>,
    traffic: web::Data<Traffic>,
) -> Result<HttpResponse, RouterError> {
    let (map, mut replicas, settlement_jobs) = db::bounded(state.db_timeout, async {
        let reads = state
            .pools
            .iter()
            .enumerate()
            .map(|(index, pool)| async move {
                let client = pool.get().await?;
                let map = schema::assignment::read_map(&**client).await?;
                let replicas = read_replicas(&**client).await?;
                let settlement = schema::settlement::read_status(&**client)
                    .await
                    .map_err(|e| {
                        tracing::debug!(shard = index, error = %e, "no settlement job status");
                        e.to_string()
                    });
                Ok::<_, DbError>((map, replicas, settlement))
            });
        // Never empty: a configuration names at least one shard.
        let mut shards = futures::future::try_join_all(reads).await?.into_iter();
        let (mut map, mut replicas, first) = shards
            .next()
            .ok_or_else(|| DbError::Timeout(state.db_timeout))?;
        let mut jobs = vec![first];
        for (other, more, job) in shards {
            map.revision = map.revision.max(other.revision);
            map.partitions.extend(other.partitions);
            replicas.extend(more);
            jobs.push(job);
        }
        map.partitions.sort_by_key(|p| p.partition);
        replicas.sort_by(|a, b| a.replica_id.cmp(&b.replica_id));
        Ok::<_, DbError>((map, replicas, jobs))
    })
    .await
    .map_err(|e| RouterError::Storage(e.to_string()))?;
    // The catalog's job at the top level (`null` when it cannot be read), every shard's listed.
    let settlement = settlement_jobs
        .first()
        .and_then(|job| job.as_ref().ok().cloned());
    let shards = state
        .shard_names
        .iter()
        .zip(settlement_reads(settlement_jobs))
        .enumerate()
        .map(|(index, (name, status))| ShardOverview {
            settlement: ShardSettlement {
                name: name.to_string(),
                status,
            },
            partitions: (0..map.partition_count)
                .filter(|p| state.cache.shard_of(*p) == Some(index))
                .collect(),
        })
        .collect();
    for replica in &mut replicas {
        replica.partitions_owned = map
            .partitions
            .iter()
            .filter(|p| p.owner_id.as_deref() == Some(replica.replica_id.as_str()))
            .count() as u32;
    }
    let body = Overview {
        router_revision: state.cache.current().map(|m| m.revision()),
        partition_count: map.partition_count,
        revision: map.revision,
        partitions: map.partitions,
        replicas,
        settlement,
        shards,
        traffic: traffic.snapshot(Instant::now()),
    };
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(body))
}

async fn read_replicas<C: GenericClient>(
    client: &C,
) -> Result<Vec<Replica>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT replica_id, advertise_url, started_at, heartbeat_at,
                    (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint,
                    expires_at > now()
               FROM replicas
              ORDER BY replica_id",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| Replica {
            replica_id: row.get(0),
            advertise_url: row.get(1),
            started_at: row.get(2),
            heartbeat_at: row.get(3),
            heartbeat_age_ms: row.get(4),
            alive: row.get(5),
            partitions_owned: 0,
        })
        .collect())
}

/// Each shard's settlement read as the overview lists it.
fn settlement_reads(
    jobs: Vec<Result<SettlementStatus, String>>,
) -> impl Iterator<Item = ShardSettlementRead> {
    jobs.into_iter().map(|job| match job {
        Ok(status) => ShardSettlementRead::Status(status),
        Err(error) => ShardSettlementRead::Unreadable { error },
    })
}
