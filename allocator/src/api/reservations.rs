//! `/v1/reservations` handlers.

use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};

use super::{refusal, written, ApiError, AppState};
use crate::fenced::{read_reservation, Command, Outcome, ReservationRecord};
use schema::partition::partition_for;
use schema::wire::{
    is_order_line_id, reserved_id_refusal, ReservationId, ReserveRequest, TtlSeconds,
    HEADER_ORDER_LINE,
};

pub async fn reserve(
    state: web::Data<AppState>,
    request: HttpRequest,
    body: web::Json<ReserveRequest>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let order_line = forwards_an_order_line(&request)?;
    if is_order_line_id(body.reservation_id.as_str()) && !order_line {
        return Err(ApiError::InvalidRequest(reserved_id_refusal(
            body.reservation_id.as_str(),
        )));
    }
    let partition = partition_for(body.sku.as_str(), state.partition_count);
    let command = Command::Reserve {
        reservation_id: body.reservation_id.as_str().to_owned(),
        sku: body.sku.into_string(),
        quantity: body.quantity.get(),
        ttl_seconds: TtlSeconds::or_default(body.ttl_seconds).get(),
        owner: access::current_owner(),
    };
    let (outcome, epoch) = state.dispatch(&request, partition, command).await?;
    let response = reservation_response(outcome, epoch)?;
    tracing::debug!(partition, epoch, reservation_id = %body.reservation_id, status = response.status().as_u16(), "reserve");
    Ok(response)
}

/// A router placing an order line: it says so ([`HEADER_ORDER_LINE`]) and the access gate trusts
/// it as a router (the `router` scope, or authentication off). Anyone else gets the same `400` a
/// router gives its clients for an id in the order-line namespace.
/// The header's only documented value is `true`; any other is refused rather than ignored.
fn forwards_an_order_line(request: &HttpRequest) -> Result<bool, ApiError> {
    match request.headers().get(HEADER_ORDER_LINE) {
        None => Ok(false),
        Some(value) if value.as_bytes().eq_ignore_ascii_case(b"true") => {
            Ok(request.extensions().contains::<access::TrustedRouter>())
        }
        Some(_) => Err(ApiError::InvalidRequest(format!(
            "{HEADER_ORDER_LINE} may only be `true`"
        ))),
    }
}

pub async fn confirm(
    state: web::Data<AppState>,
    request: HttpRequest,
    path: web::Path<ReservationId>,
) -> Result<HttpResponse, ApiError> {
    transition(state, request, path.into_inner(), true).await
}

pub async fn release(
    state: web::Data<AppState>,
    request: HttpRequest,
    path: web::Path<ReservationId>,
) -> Result<HttpResponse, ApiError> {
    transition(state, request, path.into_inner(), false).await
}

async fn transition(
    state: web::Data<AppState>,
    request: HttpRequest,
    reservation_id: ReservationId,
    confirm: bool,
) -> Result<HttpResponse, ApiError> {
    let partition = {
        let client = state.pool.get().await?;
        read_reservation(&**client, reservation_id.as_str()).await?
    }
    // Another client's, or outside the caller's SKU namespaces, it does not exist for the caller
    // (DESIGN.md §9); the fenced batch checks the owner again where it reads the row.
    .filter(|record| access::sku_visible(record.sku()))
    .ok_or_else(|| ApiError::NotFound(format!("reservation {reservation_id} does not exist")))?
    .partition();
    let reservation_id = reservation_id.into_string();
    let owner = access::current_owner();
    let command = if confirm {
        Command::Confirm {
            reservation_id,
            owner,
        }
    } else {
        Command::Release {
            reservation_id,
            owner,
        }
    };
    let (outcome, epoch) = state.dispatch(&request, partition, command).await?;
    reservation_response(outcome, epoch)
}

/// Map a worker outcome about a reservation to its HTTP answer.
fn reservation_response(outcome: Outcome, epoch: i64) -> Result<HttpResponse, ApiError> {
    match outcome {
        Outcome::Reservation {
            reservation,
            created,
            replayed,
        } => Ok(written(created, replayed, epoch, reservation)),
        Outcome::InsufficientStock {
            available,
            replayed,
        } => Err(ApiError::InsufficientStock {
            available,
            replayed,
        }),
        Outcome::HoldQuotaExceeded {
            quota,
            limit,
            detail,
            ..
        } => {
            let client = access::current_client().unwrap_or_default();
            metrics::counter!(crate::metrics::ACCESS_METRICS.quota_refusals, "client" => client, "quota" => quota.as_str())
                .increment(1);
            Err(ApiError::HoldQuotaExceeded {
                quota,
                limit,
                detail,
            })
        }
        Outcome::InvalidState { current } => Err(ApiError::InvalidState { current }),
        other => Err(refusal(other)),
    }
}

pub async fn get(
    state: web::Data<AppState>,
    path: web::Path<ReservationId>,
) -> Result<HttpResponse, ApiError> {
    let reservation_id = path.into_inner();
    let client = state.pool.get().await?;
    let record = read_reservation(&**client, reservation_id.as_str())
        .await?
        .filter(|record| access::sku_visible(record.sku()));
    if let Some(record) = &record {
        state.ensure_held(&client, record.partition()).await?;
    }
    match record {
        Some(ReservationRecord::Current(reservation)) => Ok(HttpResponse::Ok().json(reservation)),
        Some(ReservationRecord::Refused { available, .. }) => Err(ApiError::InsufficientStock {
            available,
            replayed: true,
        }),
        None => Err(ApiError::NotFound(format!(
            "reservation {reservation_id} does not exist"
        ))),
    }
}
