//! `POST /v1/orders/{order_id}/reservations`: see [`crate::orders`] for the protocol.

use actix_web::{web, HttpResponse};
use allocator::wire::{OrderRequest, HEADER_REPLAYED};

use crate::app::AppState;
use crate::error::{problem_response, RouterError};
use crate::metrics;
use crate::orders::{self, OrderResult};

pub async fn create(
    state: web::Data<AppState>,
    order_id: web::Path<String>,
    body: web::Json<OrderRequest>,
) -> Result<HttpResponse, RouterError> {
    let order = body.into_inner();
    if let Err(e) = orders::validate_order(&order_id, &order) {
        metrics::record_order("invalid");
        return Err(RouterError::InvalidRequest(e));
    }
    let partition_count = state.partition_count()?;
    let result = orders::place(&state.forwarder, &order_id, &order, |sku| {
        allocator::partition::partition_for(sku, partition_count)
    })
    .await;
    Ok(match result {
        OrderResult::Placed {
            body,
            replayed: false,
        } => HttpResponse::Created().json(body),
        OrderResult::Placed {
            body,
            replayed: true,
        } => HttpResponse::Ok()
            .insert_header((HEADER_REPLAYED, "true"))
            .json(body),
        OrderResult::Failed(problem) => problem_response(HttpResponse::Conflict(), &problem),
        OrderResult::Mismatch(problem) => {
            problem_response(HttpResponse::UnprocessableEntity(), &problem)
        }
        OrderResult::Unknown(problem) => problem_response(
            HttpResponse::ServiceUnavailable()
                .insert_header(("Retry-After", "1"))
                .take(),
            &problem,
        ),
    })
}
