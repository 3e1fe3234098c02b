//! `GET /v1/partitions`: the assignment map this router currently routes by (its cache, not a
//! fresh read), so operators can see exactly what a router believes. `lease_remaining_ms` is as
//! of the read; the `X-Assignment-Revision` header repeats the map revision.

use actix_web::{web, HttpResponse};
use schema::wire::HEADER_ASSIGNMENT_REVISION;

use crate::app::AppState;
use crate::error::RouterError;

pub async fn get(state: web::Data<AppState>) -> Result<HttpResponse, RouterError> {
    let map = state
        .cache
        .current()
        .ok_or_else(|| RouterError::Storage("assignment map not loaded yet".to_owned()))?;
    Ok(HttpResponse::Ok()
        .insert_header((HEADER_ASSIGNMENT_REVISION, map.revision().to_string()))
        .json(&map.map))
}
