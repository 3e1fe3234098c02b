//! `/healthz` (the process is up), `/readyz` (an assignment map is loaded, so requests can be
//! routed) and `/metrics` (Prometheus text format).
//!
//! Ready means: the catalog's shard map has been read and names exactly the configured shards,
//! and at least one shard's assignment map is loaded. A shard whose map is not loaded yet (down
//! since the router started) is listed under `unread_shards` but does not make the router
//! unready: its partitions answer `503` while every other shard's are served, as they would be
//! by any other router (taking all of them out of a load balancer would stop every shard).

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::error::RouterError;
use crate::state::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, RouterError> {
    let names = state.cache.shard_names();
    match state.cache.current() {
        Some(map) => {
            let shards: Vec<_> = (0..map.shard_count())
                .map(|i| {
                    json!({
                        "shard": names[i].as_str(),
                        "revision": map.shard(i).map(|m| m.revision()),
                    })
                })
                .collect();
            let unread: Vec<&str> = map
                .unread_shards()
                .into_iter()
                .map(|i| names[i].as_str())
                .collect();
            Ok(HttpResponse::Ok().json(json!({
                "status": "ready",
                "revision": map.revision(),
                "partition_count": map.partition_count(),
                "shards": shards,
                "unread_shards": unread,
            })))
        }
        // A problem like every other error, with Retry-After: probes and clients read it alike.
        None => Err(RouterError::Storage(
            match state.cache.placement().problem() {
                Some(problem) => format!("not ready: {problem}"),
                None => "not ready: assignment map not loaded".to_owned(),
            },
        )),
    }
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render())
}
