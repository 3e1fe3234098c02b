//! `GET /v1/inventory/{sku}`, `GET /v1/inventory/{sku}/history` and
//! `POST /v1/inventory/{sku}/adjustments`, routed by SKU.
//! Adjustments are idempotent by `adjustment_id`, so they are retried like reservations.

use actix_web::{web, HttpResponse};
use schema::history::HistoryQuery;
use schema::wire::{AdjustmentRequest, Sku};

use crate::error::RouterError;
use crate::forward::UpstreamRequest;
use crate::ids;
use crate::state::AppState;
use schema::path::encode_segment;

pub async fn get(
    state: web::Data<AppState>,
    sku: web::Path<Sku>,
) -> Result<HttpResponse, RouterError> {
    let partition = state.partition_of(&sku)?;
    let upstream =
        UpstreamRequest::get(format!("/v1/inventory/{}", encode_segment(&sku)), partition);
    state.forward(&upstream).await
}

/// Forwarded to the SKU's owner like [`get`], with the query parsed here first: a bad `after` or
/// `limit` is answered `400` in the allocator's words without forwarding.
pub async fn history(
    state: web::Data<AppState>,
    request: actix_web::HttpRequest,
    sku: web::Path<Sku>,
) -> Result<HttpResponse, RouterError> {
    let query = HistoryQuery::parse(request.query_string()).map_err(RouterError::InvalidRequest)?;
    let partition = state.partition_of(&sku)?;
    let upstream = UpstreamRequest::get(
        format!(
            "/v1/inventory/{}/history?{}",
            encode_segment(&sku),
            query.query_string()
        ),
        partition,
    );
    state.forward(&upstream).await
}

pub async fn adjust(
    state: web::Data<AppState>,
    sku: web::Path<Sku>,
    body: web::Json<AdjustmentRequest>,
) -> Result<HttpResponse, RouterError> {
    let req = body.into_inner();
    let partition = state.partition_of(&sku)?;
    // Over several shards the id is claimed on its home shard first (DESIGN.md §12).
    ids::claim(
        &state,
        &ids::Claim {
            kind: ids::Kind::Adjustment,
            id: req.adjustment_id.as_str(),
            partition,
            sku: sku.as_str(),
            amount: req.delta.get(),
            ttl_seconds: None,
        },
    )
    .await?;
    let upstream = UpstreamRequest::post(
        format!("/v1/inventory/{}/adjustments", encode_segment(&sku)),
        partition,
    )
    .json(&req)?;
    state.forward(&upstream).await
}
