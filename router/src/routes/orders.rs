//! `POST /v1/orders/{order_id}/reservations`: see [`crate::orders`] for the protocol.

use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use schema::wire::{OrderRequest, HEADER_REPLAYED, PROBLEM_CONTENT_TYPE};

use crate::error::RouterError;
use crate::metrics;
use crate::orders::store::{StoreError, Submission};
use crate::orders::{self, OrderResult};
use crate::state::AppState;
use edge::problem;

pub async fn create(
    state: web::Data<AppState>,
    order_id: web::Path<String>,
    body: web::Json<OrderRequest>,
) -> Result<HttpResponse, RouterError> {
    let order = body.into_inner();
    let order_id = order_id.into_inner();
    if let Err(e) = orders::validate_order(&order_id, &order) {
        metrics::record_order("invalid");
        return Err(RouterError::InvalidRequest(e));
    }
    let partition_count = state.partition_count()?;
    // The order runs in its own task: a client that disconnects must not cut it off between
    // reserving and compensating, or between deciding and recording the decision.
    let task_state = state.clone();
    let answered_id = order_id.clone();
    // It keeps the request's id, log span and client.
    let work = access::with_current_client(async move {
        task_state
            .orders
            .submit(&task_state.forwarder, &order_id, &order, |sku| {
                schema::partition::partition_for(sku, partition_count)
            })
            .await
    });
    let submission = actix_web::rt::spawn(edge::request_id::propagate(work))
        .await
        .map_err(|e| RouterError::Internal(format!("order task ended abnormally: {e}")))?;
    let submission = submission.map_err(|e| {
        metrics::record_order("unknown");
        match e {
            StoreError::Busy => RouterError::Upstream {
                status: 503,
                outcome_unknown: true,
                partition: None,
                detail: "another submission of this order is still in progress; retry with the \
                         same order id"
                    .to_owned(),
            },
            // Nothing was sent to any allocator.
            StoreError::Db(e) => RouterError::Storage(e.to_string()),
            StoreError::Corrupt(e) => RouterError::Storage(e),
        }
    })?;
    Ok(match submission {
        Submission::Replay { status, body } => {
            metrics::record_order("replayed");
            replay(status, &body)
        }
        Submission::Mismatch(problem) => {
            metrics::record_order("mismatch");
            problem::body(problem::builder(StatusCode::UNPROCESSABLE_ENTITY), &problem)
        }
        Submission::NotFound => {
            metrics::record_order("not_found");
            return Err(RouterError::NotFound(format!("no order {answered_id:?}")));
        }
        Submission::Ran(result) => respond(result),
    })
}

fn respond(result: OrderResult) -> HttpResponse {
    match result {
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
        OrderResult::Failed(problem) => {
            problem::body(problem::builder(StatusCode::CONFLICT), &problem)
        }
        OrderResult::Mismatch(problem) => {
            problem::body(problem::builder(StatusCode::UNPROCESSABLE_ENTITY), &problem)
        }
        OrderResult::Unknown(problem) => {
            problem::body(problem::builder(StatusCode::SERVICE_UNAVAILABLE), &problem)
        }
    }
}

/// A decided order's stored answer, marked as a replay; "placed" replays as `200`.
fn replay(status: u16, body: &serde_json::Value) -> HttpResponse {
    let status = match status {
        201 => StatusCode::OK,
        other => StatusCode::from_u16(other).unwrap_or(StatusCode::CONFLICT),
    };
    let content_type = if status.is_success() {
        "application/json"
    } else {
        PROBLEM_CONTENT_TYPE
    };
    HttpResponse::build(status)
        .insert_header((HEADER_REPLAYED, "true"))
        .insert_header((header::CONTENT_TYPE, content_type))
        .body(body.to_string())
}
