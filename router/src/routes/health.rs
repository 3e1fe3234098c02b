//! `/healthz` (the process is up), `/readyz` (an assignment map is loaded, so requests can be
//! routed) and `/metrics` (Prometheus text format).

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::error::RouterError;
use crate::state::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, RouterError> {
    match state.cache.current() {
        Some(map) => Ok(HttpResponse::Ok().json(json!({
            "status": "ready",
            "revision": map.revision(),
            "partition_count": map.partition_count(),
        }))),
        // A problem like every other error, with Retry-After: probes and clients read it alike.
        None => Err(RouterError::Storage(
            "not ready: assignment map not loaded".into(),
        )),
    }
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render())
}
