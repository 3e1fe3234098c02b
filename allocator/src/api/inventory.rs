//! `/v1/inventory` handlers: a SKU's stock and history are read from PostgreSQL (any replica of
//! the shard holding its partition answers); adjustments go to the owning partition's worker and record their client.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{refusal, written, ApiError, AppState};
use crate::fenced::{Command, Outcome};
use schema::history::HistoryQuery;
use schema::partition::partition_for;
use schema::wire::{AdjustmentRequest, Inventory, Sku};

pub async fn get(
    state: web::Data<AppState>,
    path: web::Path<Sku>,
) -> Result<HttpResponse, ApiError> {
    let sku = path.into_inner();
    let client = state.pool.get().await?;
    state
        .ensure_held(&client, partition_for(sku.as_str(), state.partition_count))
        .await?;
    let row = client
        .query_opt(
            "SELECT partition, on_hand, available, held, confirmed, highest_epoch
               FROM inventory WHERE sku = $1",
            &[&sku.as_str()],
        )
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("sku {sku} is not stocked")))?;
    Ok(HttpResponse::Ok().json(Inventory {
        sku: sku.into_string(),
        partition: row.get::<_, i32>(0) as u32,
        on_hand: row.get(1),
        available: row.get(2),
        held: row.get(3),
        confirmed: row.get(4),
        epoch: row.get(5),
    }))
}

/// One page of the SKU's ledger in commit order, with the client of each movement
/// ([`schema::history`]); read, never written, so any replica of the partition's shard answers.
pub async fn history(
    state: web::Data<AppState>,
    request: HttpRequest,
    path: web::Path<Sku>,
) -> Result<HttpResponse, ApiError> {
    let sku = path.into_inner();
    let query = HistoryQuery::parse(request.query_string()).map_err(ApiError::InvalidRequest)?;
    let client = state.pool.get().await?;
    state
        .ensure_held(&client, partition_for(sku.as_str(), state.partition_count))
        .await?;
    let page = schema::history::read(&**client, sku.as_str(), query)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("sku {sku} is not stocked")))?;
    Ok(HttpResponse::Ok().json(page))
}

pub async fn adjust(
    state: web::Data<AppState>,
    request: HttpRequest,
    path: web::Path<Sku>,
    body: web::Json<AdjustmentRequest>,
) -> Result<HttpResponse, ApiError> {
    let sku = path.into_inner();
    let body = body.into_inner();
    let partition = partition_for(sku.as_str(), state.partition_count);
    let command = Command::Adjust {
        adjustment_id: body.adjustment_id.into_string(),
        sku: sku.into_string(),
        delta: body.delta.get(),
        owner: access::current_owner(),
    };
    let (outcome, epoch) = state.dispatch(&request, partition, command).await?;
    match outcome {
        Outcome::Adjusted {
            adjustment,
            replayed,
        } => Ok(written(!replayed, replayed, epoch, adjustment)),
        Outcome::ShrinkRefused {
            available,
            replayed,
        } => Err(ApiError::ShrinkBelowHeld {
            available,
            replayed,
        }),
        other => Err(refusal(other)),
    }
}
