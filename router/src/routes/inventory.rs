//! `GET /v1/inventory/{sku}` and `POST /v1/inventory/{sku}/adjustments`, routed by SKU.
//! Adjustments are idempotent by `adjustment_id`, so they are retried like reservations.

use actix_web::{web, HttpResponse};
use schema::wire::{validate, AdjustmentRequest};

use crate::app::AppState;
use crate::error::RouterError;
use crate::forward::UpstreamRequest;
use schema::path::encode_segment;

pub async fn get(
    state: web::Data<AppState>,
    sku: web::Path<String>,
) -> Result<HttpResponse, RouterError> {
    validate::sku(&sku).map_err(RouterError::InvalidRequest)?;
    let partition = state.partition_of(&sku)?;
    let upstream =
        UpstreamRequest::get(format!("/v1/inventory/{}", encode_segment(&sku)), partition);
    Ok(state
        .forwarder
        .forward(&upstream)
        .await?
        .into_http_response())
}

pub async fn adjust(
    state: web::Data<AppState>,
    sku: web::Path<String>,
    body: web::Json<AdjustmentRequest>,
) -> Result<HttpResponse, RouterError> {
    let req = body.into_inner();
    validate::sku(&sku).map_err(RouterError::InvalidRequest)?;
    validate::id("adjustment_id", &req.adjustment_id).map_err(RouterError::InvalidRequest)?;
    validate::delta(req.delta).map_err(RouterError::InvalidRequest)?;
    let partition = state.partition_of(&sku)?;
    let upstream = UpstreamRequest::post(
        format!("/v1/inventory/{}/adjustments", encode_segment(&sku)),
        partition,
    )
    .json(&req)?;
    Ok(state
        .forwarder
        .forward(&upstream)
        .await?
        .into_http_response())
}
