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
//! The settlement job shown is the catalog shard's only.

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
use schema::wire::{PartitionAssignment, SettlementStatus};

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
    pub traffic: TrafficSnapshot,
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
    let (map, mut replicas, settlement) = db::bounded(state.db_timeout, async {
        let reads = state
            .pools
            .iter()
            .enumerate()
            .map(|(index, pool)| async move {
                let client = pool.get().await?;
                let map = schema::assignment::read_map(&**client).await?;
                let replicas = read_replicas(&**client).await?;
                // The catalog's settlement job only (see the module's doc).
                let settlement = if index == 0 {
                    match schema::settlement::read_status(&**client).await {
                        Ok(status) => Some(status),
                        Err(e) => {
                            tracing::debug!(error = %e, "no settlement job status");
                            None
                        }
                    }
                } else {
                    None
                };
                Ok::<_, DbError>((map, replicas, settlement))
            });
        // Never empty: a configuration names at least one shard.
        let mut shards = futures::future::try_join_all(reads).await?.into_iter();
        let (mut map, mut replicas, settlement) = shards
            .next()
            .ok_or_else(|| DbError::Timeout(state.db_timeout))?;
        for (other, more, _) in shards {
            map.revision = map.revision.max(other.revision);
            map.partitions.extend(other.partitions);
            replicas.extend(more);
        }
        map.partitions.sort_by_key(|p| p.partition);
        replicas.sort_by(|a, b| a.replica_id.cmp(&b.replica_id));
        Ok::<_, DbError>((map, replicas, settlement))
    })
    .await
    .map_err(|e| RouterError::Storage(e.to_string()))?;
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
