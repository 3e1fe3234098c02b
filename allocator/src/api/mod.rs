//! The HTTP API (design §9) served by an allocator replica for the partitions it owns.
//!
//! Writes go to the owning partition's worker; a partition owned elsewhere gets `421` naming the
//! owner the database knows, one whose lease is unconfirmed gets `503` + `Retry-After`. Reads
//! (`GET` of a reservation or an inventory row) come straight from PostgreSQL, which is the
//! authority, so any replica can answer them.

mod cluster;
mod inventory;
pub mod problem;
mod reservations;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::Service;
use actix_web::error::{JsonPayloadError, PathError};
use actix_web::{web, HttpRequest};
use deadpool_postgres::Pool;
use futures::FutureExt;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::fenced::{Command, Outcome};
use crate::lease::ownership::{Ownership, Route};
use crate::metrics as m;
use crate::worker::Job;
pub use problem::ApiError;
use schema::assignment;
use schema::routes;
use schema::wire::{limits, HEADER_EXPECTED_EPOCH};

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
}

impl AppState {
    /// Queue `command` on the owning worker and wait for its outcome.
    pub async fn dispatch(
        &self,
        request: &HttpRequest,
        partition: u32,
        command: Command,
    ) -> Result<(Outcome, i64), ApiError> {
        let (epoch, sender) = match self.ownership.route(partition) {
            Route::Owned { epoch, sender } => (epoch, sender),
            Route::Uncertain => {
                return Err(ApiError::PartitionUnavailable {
                    partition,
                    reason: "lease renewal unconfirmed".into(),
                    outcome_unknown: false,
                })
            }
            Route::NotOwned => return Err(self.not_owner(partition).await),
        };
        if let Some(expected) = expected_epoch(request) {
            if expected != epoch {
                // The router routed by another epoch than the one served here: its map is out
                // of date. A 421 makes it refresh and retry, instead of acting on a view that
                // may be older than ours (or newer, when this replica lost the lease unawares).
                metrics::counter!(m::STALE_ROUTER_REQUESTS).increment(1);
                return Err(self.not_owner(partition).await);
            }
        }
        let (reply, answer) = oneshot::channel();
        if sender.try_send(Job { command, reply }).is_err() {
            metrics::counter!(m::QUEUE_REJECTIONS).increment(1);
            return Err(ApiError::PartitionUnavailable {
                partition,
                reason: "partition queue is full".into(),
                outcome_unknown: false,
            });
        }
        match tokio::time::timeout(self.request_timeout, answer).await {
            Ok(Ok(Ok(outcome))) => Ok((outcome, epoch)),
            Ok(Ok(Err(error))) => match ApiError::from(error) {
                ApiError::NotOwner { partition, .. } => Err(self.not_owner(partition).await),
                other => Err(other),
            },
            // The worker stopped (authority lost) before answering.
            Ok(Err(_)) => Err(self.not_owner(partition).await),
            Err(_) => Err(ApiError::PartitionUnavailable {
                partition,
                reason: "request deadline exceeded".into(),
                outcome_unknown: true,
            }),
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

fn expected_epoch(request: &HttpRequest) -> Option<i64> {
    request
        .headers()
        .get(HEADER_EXPECTED_EPOCH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn json_error(error: JsonPayloadError, _: &HttpRequest) -> actix_web::Error {
    match error {
        JsonPayloadError::Overflow { limit } => ApiError::PayloadTooLarge { limit },
        JsonPayloadError::OverflowKnownLength { limit, .. } => ApiError::PayloadTooLarge { limit },
        JsonPayloadError::Deserialize(e) => ApiError::InvalidRequest(format!("invalid body: {e}")),
        JsonPayloadError::ContentType => {
            ApiError::InvalidRequest("content type must be application/json".into())
        }
        other => ApiError::InvalidRequest(format!("invalid body: {other}")),
    }
    .into()
}

fn path_error(error: PathError, _: &HttpRequest) -> actix_web::Error {
    ApiError::InvalidRequest(format!("invalid path: {error}")).into()
}

async fn method_not_allowed() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound("no such route".into()))
}

fn resource(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

/// Register every route, extractor limit and error handler on an actix `App`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::JsonConfig::default()
            .limit(limits::BODY_MAX_BYTES)
            .content_type_required(false)
            .error_handler(json_error),
    )
    .app_data(web::PathConfig::default().error_handler(path_error))
    .service(resource(routes::RESERVE.path).route(web::post().to(reservations::reserve)))
    .service(resource(routes::CONFIRM.path).route(web::post().to(reservations::confirm)))
    .service(resource(routes::RELEASE.path).route(web::post().to(reservations::release)))
    .service(resource(routes::GET_RESERVATION.path).route(web::get().to(reservations::get)))
    .service(resource(routes::GET_INVENTORY.path).route(web::get().to(inventory::get)))
    .service(resource(routes::ADJUST.path).route(web::post().to(inventory::adjust)))
    .service(resource(routes::PARTITIONS.path).route(web::get().to(cluster::partitions)))
    .service(resource(routes::HEALTHZ.path).route(web::get().to(cluster::healthz)))
    .service(resource(routes::READYZ.path).route(web::get().to(cluster::readyz)))
    .service(resource(routes::METRICS.path).route(web::get().to(cluster::metrics)))
    .default_service(web::to(not_found));
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
    actix_web::App::new()
        .app_data(state)
        .wrap_fn(|request, service| {
            let started = Instant::now();
            let route = request.match_pattern().unwrap_or_else(|| "unmatched".into());
            service.call(request).map(move |result| {
                let status = match &result {
                    Ok(response) => response.status().as_u16(),
                    Err(error) => error.as_response_error().status_code().as_u16(),
                };
                metrics::histogram!(m::HTTP_REQUEST_DURATION, "route" => route, "status" => status.to_string())
                    .record(started.elapsed().as_secs_f64());
                result
            })
        })
        .configure(configure)
}
