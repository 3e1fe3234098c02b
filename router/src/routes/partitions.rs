//! Cluster views. `GET /v1/partitions`: the assignment map this router currently routes by (its
//! cache, not a fresh read), so operators can see exactly what a router believes;
//! `lease_remaining_ms` is as of the read and `X-Assignment-Revision` repeats the map revision.
//! With several shards it is every shard's map merged in partition order, each entry with its
//! own shard's revision; the map's `revision` (and the header) is the highest over the shards,
//! a summary only, since revisions of two shards are not comparable.
//! `GET /v1/jobs/settlement`: the settlement jobs' status (the catalog's, and every shard's), and
//! `GET /v1/events`: one page of a change-event stream (a partition's, or one shard's settled
//! windows), both read from PostgreSQL as an allocator reads them.

use actix_web::{web, HttpResponse};
use schema::events::{EventQuery, QueryError, Stream, SETTLEMENT_STREAM};
use schema::wire::HEADER_ASSIGNMENT_REVISION;

use crate::db;
use crate::error::RouterError;
use crate::settlement;
use crate::state::AppState;

pub async fn get(state: web::Data<AppState>) -> Result<HttpResponse, RouterError> {
    let map = state
        .cache
        .current()
        .ok_or_else(|| RouterError::Storage("assignment map not loaded yet".to_owned()))?;
    Ok(HttpResponse::Ok()
        .insert_header((HEADER_ASSIGNMENT_REVISION, map.revision().to_string()))
        .json(map.merged()))
}

/// The settlement jobs' status: the catalog shard's at the top level and every shard's in
/// `shards` ([`crate::settlement`]); a shard that cannot be read is listed with its `error`, and
/// only the catalog's failure fails the answer.
pub async fn settlement(state: web::Data<AppState>) -> Result<HttpResponse, RouterError> {
    let reads = settlement::read_all(&state.shards(), state.db_timeout).await;
    let status = settlement::answer(reads).map_err(|e| RouterError::Storage(e.to_string()))?;
    Ok(HttpResponse::Ok().json(status))
}

/// One page of a stream: `partition/N` from the shard holding partition N; `settlement` (the
/// catalog shard's windows) from the catalog, `settlement/<shard>` from that shard; a shard this
/// router is not configured with, or the catalog by its name, is no stream (`404`).
pub async fn events(
    state: web::Data<AppState>,
    request: actix_web::HttpRequest,
) -> Result<HttpResponse, RouterError> {
    let query = EventQuery::parse(request.query_string(), state.partition_count()?).map_err(
        |e| match e {
            QueryError::Invalid(detail) => RouterError::InvalidRequest(detail),
            QueryError::NoStream(detail) => RouterError::NotFound(detail),
        },
    )?;
    let pool = match &query.stream {
        Stream::Partition(partition) => state.pool_of(*partition)?,
        Stream::Settlement(None) => state.catalog_pool(),
        Stream::Settlement(Some(shard)) => {
            let shards = state.cache.shard_names();
            match shards.iter().position(|s| s == shard) {
                Some(index) if index > 0 => &state.pools[index],
                Some(_) => {
                    return Err(RouterError::NotFound(format!(
                        "no stream {}: shard {shard} is the catalog, its settlement stream is \
                         `{SETTLEMENT_STREAM}`",
                        query.stream.name()
                    )))
                }
                None => {
                    let names: Vec<&str> = shards.iter().map(|s| s.as_str()).collect();
                    return Err(RouterError::NotFound(format!(
                        "no stream {}: this cluster's shards are {names:?}",
                        query.stream.name()
                    )));
                }
            }
        }
    };
    let events = db::events(pool, state.db_timeout, &query)
        .await
        .map_err(|e| RouterError::Storage(e.to_string()))?;
    Ok(HttpResponse::Ok().json(query.page(events)))
}
