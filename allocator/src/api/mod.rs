//! The HTTP API (DESIGN.md §9) served by an allocator replica for the partitions it owns.
//!
//! Writes go to the owning partition's worker; a partition owned elsewhere gets `421` naming the
//! owner the database knows, one whose lease is unconfirmed gets `503` + `Retry-After`. Reads
//! (`GET` of a reservation, an inventory row, a SKU's history or a partition's events) come
//! straight from PostgreSQL, which is the authority, so any replica of the shard that holds the
//! partition can answer them; a replica of another shard answers `421` like a write
//! ([`AppState::ensure_held`]): a shard the partition moved away from keeps a frozen copy.

mod cluster;
mod docs;
mod inventory;
pub mod problem;
pub mod readiness;
mod reservations;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::Service;
use actix_web::{web, HttpRequest, HttpResponse};
use deadpool_postgres::Pool;
use futures::FutureExt;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::dispatch::{dispatch, Dispatch};
use crate::fenced::{Command, Outcome};
use crate::metrics as m;
use crate::replica::ownership::Ownership;
use crate::work::WorkError;
use edge::problem::{json_config, path_config, resource};
pub use problem::ApiError;
use schema::assignment;
use schema::routes;
use schema::wire::{
    HEADER_ASSIGNMENT_REVISION, HEADER_EPOCH, HEADER_EXPECTED_EPOCH, HEADER_REPLAYED,
};

/// The answer to a write its partition's worker applied or replayed: `201` when this request
/// created what it names, `200` otherwise; `Idempotent-Replayed: true` on a replay; and the epoch
/// it was written under, so callers can tell tenures apart. The same for every write route.
fn written(created: bool, replayed: bool, epoch: i64, body: impl serde::Serialize) -> HttpResponse {
    let mut response = if created {
        HttpResponse::Created()
    } else {
        HttpResponse::Ok()
    };
    if replayed {
        response.insert_header((HEADER_REPLAYED, "true"));
    }
    response.insert_header((HEADER_EPOCH, epoch.to_string()));
    response.json(body)
}

/// The refusals every write route answers alike: the id was used before with another request
/// (`422 idempotency-mismatch`), or what it names does not exist (`404`). Any other outcome is one
/// the route does not expect for its command: a bug, not a refusal.
fn refusal(outcome: Outcome) -> ApiError {
    match outcome {
        Outcome::Mismatch { detail } => ApiError::IdempotencyMismatch(detail),
        Outcome::NotFound { detail } => ApiError::NotFound(detail),
        other => ApiError::StorageUnavailable(format!("unexpected outcome {}", other.result())),
    }
}

/// Shared by every HTTP worker; built once, outside actix's per-worker factory.
pub struct AppState {
    pub pool: Pool,
    pub ownership: Arc<Ownership>,
    pub partition_count: u32,
    pub request_timeout: Duration,
    pub metrics: PrometheusHandle,
    /// Flips to true after the first campaign round; `/readyz` reports it.
    pub ready: tokio::sync::watch::Receiver<bool>,
    pub shutdown: CancellationToken,
    /// Who may call what (DESIGN.md §9); wraps every route.
    pub access: Arc<access::Gate>,
    /// `/readyz`'s database check, on a connection of its own.
    pub readiness: readiness::Readiness,
}

impl AppState {
    /// Queue `command` on the owning worker and wait for its outcome.
    pub async fn dispatch(
        &self,
        request: &HttpRequest,
        partition: u32,
        command: Command,
    ) -> Result<(Outcome, i64), ApiError> {
        let expected_epoch = routing_headers(request)?;
        let dispatched = dispatch(
            &self.ownership,
            Dispatch {
                partition,
                expected_epoch,
                command,
                timeout: self.request_timeout,
                stamps: crate::stages::of(request),
            },
        )
        .await;
        match dispatched {
            Ok((outcome, token)) => Ok((outcome, token.epoch)),
            Err(WorkError::NotOwner { partition }) => Err(self.not_owner(partition).await),
            Err(error) => Err(ApiError::from(error)),
        }
    }

    /// `Ok` when this replica's shard holds `partition` (its own record, DESIGN.md §12), else the
    /// `421` a write for it gets: reads are answered only by the shard that holds the partition.
    pub async fn ensure_held(
        &self,
        client: &tokio_postgres::Client,
        partition: u32,
    ) -> Result<(), ApiError> {
        if schema::shard::store::holds_partition(client, partition).await? {
            Ok(())
        } else {
            Err(self.not_owner(partition).await)
        }
    }

    /// A `421` carrying the owner the database knows, when it can be read quickly.
    pub async fn not_owner(&self, partition: u32) -> ApiError {
        metrics::counter!(m::MISDIRECTED_REQUESTS).increment(1);
        let lookup = async {
            let client = self.pool.get().await.ok()?;
            assignment::read_partition(&**client, partition)
                .await
                .ok()?
        };
        let entry = tokio::time::timeout(Duration::from_millis(500), lookup)
            .await
            .ok()
            .flatten();
        ApiError::NotOwner {
            partition,
            owner_id: entry.as_ref().and_then(|e| e.owner_id.clone()),
            owner_url: entry.as_ref().and_then(|e| e.owner_url.clone()),
            epoch: entry.as_ref().map(|e| e.epoch),
            revision: entry.as_ref().map(|e| e.revision),
        }
    }
}

/// The routing headers a router sets when it forwards: the epoch it expects (returned) and the
/// assignment revision it routed by. Both are advisory, but a value that is there and not an
/// integer is refused rather than ignored: only a broken or hostile caller sends one.
fn routing_headers(request: &HttpRequest) -> Result<Option<i64>, ApiError> {
    let integer = |name: &str| -> Result<Option<i64>, ApiError> {
        let Some(value) = request.headers().get(name) else {
            return Ok(None);
        };
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .map(Some)
            .ok_or_else(|| ApiError::InvalidRequest(format!("{name} must be an integer")))
    };
    integer(HEADER_ASSIGNMENT_REVISION)?;
    integer(HEADER_EXPECTED_EPOCH)
}

/// The `route` label of a request: the static template of the named resource it matches (no
/// allocation on the API's routes), else the matched pattern, else `unmatched`.
fn route_label(request: &actix_web::dev::ServiceRequest) -> metrics::SharedString {
    request
        .match_name()
        .and_then(|name| routes::ALL.iter().find(|route| route.path == name))
        .map(|route| metrics::SharedString::from(route.path))
        .or_else(|| request.match_pattern().map(Into::into))
        .unwrap_or_else(|| metrics::SharedString::from("unmatched"))
}

/// The `status` label: the statuses the API answers with as static strings, others formatted.
fn status_label(status: u16) -> metrics::SharedString {
    let known = match status {
        200 => "200",
        201 => "201",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        409 => "409",
        421 => "421",
        422 => "422",
        429 => "429",
        503 => "503",
        _ => return status.to_string().into(),
    };
    known.into()
}

/// Register every route, extractor limit and error handler on an actix `App`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(json_config())
        .app_data(path_config())
        .service(resource(routes::RESERVE.path).route(web::post().to(reservations::reserve)))
        .service(resource(routes::CONFIRM.path).route(web::post().to(reservations::confirm)))
        .service(resource(routes::RELEASE.path).route(web::post().to(reservations::release)))
        .service(resource(routes::GET_RESERVATION.path).route(web::get().to(reservations::get)))
        .service(resource(routes::GET_INVENTORY.path).route(web::get().to(inventory::get)))
        .service(resource(routes::ADJUST.path).route(web::post().to(inventory::adjust)))
        .service(resource(routes::INVENTORY_HISTORY.path).route(web::get().to(inventory::history)))
        .service(resource(routes::PARTITIONS.path).route(web::get().to(cluster::partitions)))
        .service(resource(routes::SETTLEMENT_STATUS.path).route(web::get().to(cluster::settlement)))
        .service(resource(routes::EVENTS.path).route(web::get().to(cluster::events)))
        .service(resource(routes::HEALTHZ.path).route(web::get().to(cluster::healthz)))
        .service(resource(routes::READYZ.path).route(web::get().to(cluster::readyz)))
        .service(resource(routes::METRICS.path).route(web::get().to(cluster::metrics)))
        .configure(docs::configure)
        .default_service(web::to(edge::problem::not_found));
}

/// Build the actix `App` factory body; shared by the binary and tests.
pub fn app(
    state: web::Data<AppState>,
) -> actix_web::App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let gate = state.access.clone();
    actix_web::App::new()
        .app_data(state)
        // Innermost: a refusal is timed, counted by route and logged under the request id.
        .wrap(access::AccessControl::new(gate))
        .wrap_fn(|request, service| {
            let started = Instant::now();
            let route = route_label(&request);
            crate::stages::begin(&request, started);
            service.call(request).map(move |mut result| {
                let status = match &mut result {
                    Ok(response) => {
                        crate::stages::finish(response, Instant::now());
                        response.status().as_u16()
                    }
                    Err(error) => error.as_response_error().status_code().as_u16(),
                };
                metrics::histogram!(m::HTTP_REQUEST_DURATION, "route" => route, "status" => status_label(status))
                    .record(started.elapsed().as_secs_f64());
                result
            })
        })
        .wrap_fn(edge::request_id::middleware)
        // Outermost: everything above takes its decisions on the path the handler will see.
        .wrap_fn(edge::canonical::middleware)
        .configure(configure)
}
