//! `/v1/reservations` handlers.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{ApiError, AppState};
use crate::fenced::{Command, Outcome};
use schema::assignment;
use schema::partition::partition_for;
use schema::wire::{
    Reservation, ReservationId, ReservationStatus, ReserveRequest, TtlSeconds, HEADER_EPOCH,
    HEADER_REPLAYED,
};

pub async fn reserve(
    state: web::Data<AppState>,
    request: HttpRequest,
    body: web::Json<ReserveRequest>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let partition = partition_for(body.sku.as_str(), state.partition_count);
    let command = Command::Reserve {
        reservation_id: body.reservation_id.as_str().to_owned(),
        sku: body.sku.into_string(),
        quantity: body.quantity.get(),
        ttl_seconds: TtlSeconds::or_default(body.ttl_seconds).get(),
    };
    let (outcome, epoch) = state.dispatch(&request, partition, command).await?;
    let response = reservation_response(outcome, epoch)?;
    tracing::debug!(partition, epoch, reservation_id = %body.reservation_id, status = response.status().as_u16(), "reserve");
    Ok(response)
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
        assignment::reservation_partition(&**client, &reservation_id).await?
    }
    .ok_or_else(|| ApiError::NotFound(format!("reservation {reservation_id} does not exist")))?;
    let reservation_id = reservation_id.into_string();
    let command = if confirm {
        Command::Confirm { reservation_id }
    } else {
        Command::Release { reservation_id }
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
        } => {
            let mut response = if created {
                HttpResponse::Created()
            } else {
                HttpResponse::Ok()
            };
            if replayed {
                response.insert_header((HEADER_REPLAYED, "true"));
            }
            response.insert_header((HEADER_EPOCH, epoch.to_string()));
            Ok(response.json(reservation))
        }
        Outcome::InsufficientStock {
            available,
            replayed,
        } => Err(ApiError::InsufficientStock {
            available,
            replayed,
        }),
        Outcome::Mismatch { detail } => Err(ApiError::IdempotencyMismatch(detail)),
        Outcome::NotFound { detail } => Err(ApiError::NotFound(detail)),
        Outcome::InvalidState { current } => Err(ApiError::InvalidState { current }),
        other => Err(ApiError::StorageUnavailable(format!(
            "unexpected outcome {}",
            other.result()
        ))),
    }
}

pub async fn get(
    state: web::Data<AppState>,
    path: web::Path<ReservationId>,
) -> Result<HttpResponse, ApiError> {
    let reservation_id = path.into_inner();
    let client = state.pool.get().await?;
    let row = client
        .query_opt(
            "SELECT sku, quantity, status, epoch, expires_at, partition, available_at_refusal,
                    status = 'held' AND expires_at <= now() AS overdue
               FROM reservations WHERE reservation_id = $1",
            &[&reservation_id.as_str()],
        )
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!("reservation {reservation_id} does not exist"))
        })?;
    let status: String = row.get(2);
    let overdue: Option<bool> = row.get(7);
    let status = match status.as_str() {
        "rejected" => {
            return Err(ApiError::InsufficientStock {
                available: row.get::<_, Option<i64>>(6).unwrap_or(0),
                replayed: true,
            })
        }
        // The sweeper may not have reached it yet; the hold is over all the same.
        "held" if overdue == Some(true) => ReservationStatus::Expired,
        "held" => ReservationStatus::Held,
        "confirmed" => ReservationStatus::Confirmed,
        "released" => ReservationStatus::Released,
        _ => ReservationStatus::Expired,
    };
    Ok(HttpResponse::Ok().json(Reservation {
        reservation_id: reservation_id.into_string(),
        status,
        sku: row.get(0),
        quantity: row.get(1),
        epoch: row.get(3),
        expires_at: row.get(4),
        partition: row.get::<_, i32>(5) as u32,
    }))
}
