//! `POST /v1/reservations`, `GET /v1/reservations/{id}`, `POST .../confirm`, `POST .../release`.
//!
//! A new reservation is routed by its SKU; an id in the order-line namespace
//! ([`schema::wire::ORDER_LINE_PREFIX`]) is refused with `400` (only orders create those). Existing reservations are addressed by id only, so the
//! router looks their partition up in PostgreSQL
//! ([`schema::assignment::reservation_partition`]), on every shard at once since an id names no
//! shard, taking the row of the shard that holds its partition ([`db::reservation_partition`]);
//! an id no shard knows, and another client's reservation
//! ([`access::Owner`]), is a `404` without bothering an allocator, while a shard that cannot
//! answer (and no other knowing the id) is a `503`, never a `404`.

use actix_web::{web, HttpResponse};
use schema::wire::{
    is_order_line_id, reserved_id_refusal, ReservationId, ReserveRequest, TtlSeconds,
};

use crate::db;
use crate::error::RouterError;
use crate::forward::UpstreamRequest;
use crate::ids;
use crate::state::AppState;
use schema::path::encode_segment;

pub async fn create(
    state: web::Data<AppState>,
    body: web::Json<ReserveRequest>,
) -> Result<HttpResponse, RouterError> {
    let req = body.into_inner();
    // Order lines are placed by orders only (see `schema::wire::order_line_id`).
    if is_order_line_id(req.reservation_id.as_str()) {
        return Err(RouterError::InvalidRequest(reserved_id_refusal(
            req.reservation_id.as_str(),
        )));
    }
    let partition = state.partition_of(&req.sku)?;
    // Over several shards: the id is claimed on its home shard, and the client's holds on the
    // other shards go with the reserve for its hold quota (DESIGN.md §12); both reads at once.
    let claim = ids::Claim {
        kind: ids::Kind::Reservation,
        id: req.reservation_id.as_str(),
        partition,
        sku: req.sku.as_str(),
        amount: req.quantity.get(),
        ttl_seconds: Some(i64::from(TtlSeconds::or_default(req.ttl_seconds).get())),
    };
    let (claimed, held_elsewhere) = futures::join!(
        ids::claim(&state, &claim),
        ids::held_elsewhere(&state, partition)
    );
    claimed?;
    let mut upstream = UpstreamRequest::post("/v1/reservations".to_owned(), partition)
        .reservation(&req.reservation_id)
        .json(&req)?;
    upstream.held_elsewhere = held_elsewhere?;
    state.forward(&upstream).await
}

pub async fn get(
    state: web::Data<AppState>,
    id: web::Path<ReservationId>,
) -> Result<HttpResponse, RouterError> {
    by_id(&state, &id, None).await
}

pub async fn confirm(
    state: web::Data<AppState>,
    id: web::Path<ReservationId>,
) -> Result<HttpResponse, RouterError> {
    by_id(&state, &id, Some("confirm")).await
}

pub async fn release(
    state: web::Data<AppState>,
    id: web::Path<ReservationId>,
) -> Result<HttpResponse, RouterError> {
    by_id(&state, &id, Some("release")).await
}

/// GET (no `action`) or POST a transition for an existing reservation.
async fn by_id(
    state: &AppState,
    id: &ReservationId,
    action: Option<&str>,
) -> Result<HttpResponse, RouterError> {
    let id = id.as_str();
    let shard_of = |partition| state.cache.shard_of(partition);
    let partition = match db::reservation_partition(&state.pools, state.db_timeout, id, shard_of)
        .await
    {
        // Another client's, or outside the client's namespaces: answered as an unknown id, here
        // already, so not even the answer's headers tell it apart (the owning allocator checks
        // the owner again inside its fenced transaction).
        Ok(Some(place))
            if access::owner_visible(place.owner.as_deref()) && access::sku_visible(&place.sku) =>
        {
            place.partition
        }
        Ok(Some(_)) => return Err(RouterError::NotFound(format!("no reservation {id:?}"))),
        Ok(None) => return Err(RouterError::NotFound(format!("no reservation {id:?}"))),
        Err(e) => {
            tracing::warn!(reservation_id = id, error = %e, "reservation lookup failed");
            return Err(RouterError::Storage(e.to_string()));
        }
    };
    let path = match action {
        None => format!("/v1/reservations/{}", encode_segment(id)),
        Some(action) => format!("/v1/reservations/{}/{action}", encode_segment(id)),
    };
    let upstream = match action {
        None => UpstreamRequest::get(path, partition),
        Some(_) => UpstreamRequest::post(path, partition),
    }
    .reservation(id);
    state.forward(&upstream).await
}
