//! Cluster endpoints: ownership map, settlement status, change events, health, readiness,
//! metrics.

use actix_web::{web, HttpResponse};

use super::{ApiError, AppState};
use schema::assignment;
use schema::events::{read, EventQuery, QueryError, Stream};

pub async fn partitions(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let client = state.pool.get().await?;
    let map = assignment::read_map(&**client).await?;
    Ok(HttpResponse::Ok().json(map))
}

/// The settlement job's holder, term and progress; read from the database, so every replica
/// answers the same.
pub async fn settlement(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let client = state.pool.get().await?;
    let status = schema::settlement::read_status(&**client).await?;
    Ok(HttpResponse::Ok().json(status))
}

/// One page of a change-event stream, read from the database: what a consumer that fell behind
/// Redis (or started after its streams were trimmed) reads to fill its gap (DESIGN.md §14).
pub async fn events(
    state: web::Data<AppState>,
    request: actix_web::HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query =
        EventQuery::parse(request.query_string(), state.partition_count).map_err(|e| match e {
            QueryError::Invalid(detail) => ApiError::InvalidRequest(detail),
            QueryError::NoStream(detail) => ApiError::NotFound(detail),
        })?;
    let client = state.pool.get().await?;
    if let Stream::Partition(partition) = &query.stream {
        // Only the shard that holds the partition serves its positions, those from before it
        // moved here included (DESIGN.md §12); a source keeps a frozen copy.
        state.ensure_held(&client, *partition).await?;
    }
    if let Stream::Settlement(_) = &query.stream {
        // The database holds its own shard's settled windows only.
        let own = read::own_settlement_stream(&**client).await?;
        if own != query.stream {
            return Err(ApiError::NotFound(format!(
                "no stream {}: this replica's shard settles `{}`",
                query.stream.name(),
                own.name()
            )));
        }
    }
    let events = read::stream_after(&**client, &query.stream, query.after, query.limit).await?;
    Ok(HttpResponse::Ok().json(query.page(events)))
}

/// Liveness: the process answers.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// Readiness: registered with the cluster, the database answers (as checked at most a second
/// ago), not shutting down.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if state.shutdown.is_cancelled() {
        return Err(ApiError::StorageUnavailable("shutting down".into()));
    }
    if !*state.ready.borrow() {
        return Err(ApiError::StorageUnavailable(
            "first campaign round has not completed".into(),
        ));
    }
    // Cached and bounded, on a connection of its own (`readiness`): the path is open to anyone.
    state
        .readiness
        .database()
        .await
        .map_err(ApiError::StorageUnavailable)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "status": "ready",
        "leases_held": state.ownership.held().len(),
    })))
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render())
}
