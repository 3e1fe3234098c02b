//! The public HTTP surface: the same paths as the allocator's API (DESIGN.md §9) plus orders.
//!
//! Bodies and path segments deserialise into the parsed wire values ([`schema::wire::Sku`],
//! [`schema::wire::ReservationId`], ...: the same rules and words as the allocator); handlers
//! compute the partition and hand the request to [`crate::forward`]. Malformed JSON,
//! unknown fields and bad path segments are answered here with a `400` problem, oversized bodies
//! with `413` (as the allocator does); they are never forwarded and never reach a `500`.

pub mod health;
pub mod inventory;
pub mod orders;
pub mod partitions;
pub mod reservations;

use actix_web::error::{JsonPayloadError, PathError};
use actix_web::{web, HttpRequest, HttpResponse};
use schema::routes;
use schema::wire::{limits, rule_violation};

use crate::error::RouterError;

/// Register every route.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(json_config())
        .app_data(path_config())
        .service(
            web::resource(routes::RESERVE.path)
                .route(web::post().to(reservations::create))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::GET_RESERVATION.path)
                .route(web::get().to(reservations::get))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::CONFIRM.path)
                .route(web::post().to(reservations::confirm))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::RELEASE.path)
                .route(web::post().to(reservations::release))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::GET_INVENTORY.path)
                .route(web::get().to(inventory::get))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::ADJUST.path)
                .route(web::post().to(inventory::adjust))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::RESERVE_ORDER.path)
                .route(web::post().to(orders::create))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::PARTITIONS.path)
                .route(web::get().to(partitions::get))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::SETTLEMENT_STATUS.path)
                .route(web::get().to(partitions::settlement))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::EVENTS.path)
                .route(web::get().to(partitions::events))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::HEALTHZ.path)
                .route(web::get().to(health::healthz))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::READYZ.path)
                .route(web::get().to(health::readyz))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource(routes::METRICS.path)
                .route(web::get().to(health::metrics))
                .default_service(web::to(method_not_allowed)),
        );
}

/// JSON bodies: bounded size, unknown fields refused by the wire types, every failure a 4xx
/// problem: `413` for an oversized body (as the allocator answers on the same paths), `400` for
/// everything else. The content type is not enforced, again like the allocator.
fn json_config() -> web::JsonConfig {
    web::JsonConfig::default()
        .limit(limits::BODY_MAX_BYTES)
        .content_type_required(false)
        .error_handler(|err, _req| {
            let error = match &err {
                JsonPayloadError::Overflow { .. }
                | JsonPayloadError::OverflowKnownLength { .. } => {
                    RouterError::PayloadTooLarge(limits::BODY_MAX_BYTES)
                }
                // A value the wire types refused is answered in the rule's own words.
                JsonPayloadError::Deserialize(e) => RouterError::InvalidRequest(
                    rule_violation(&e.to_string())
                        .map_or_else(|| format!("invalid JSON body: {e}"), str::to_owned),
                ),
                other => RouterError::InvalidRequest(format!("unreadable body: {other}")),
            };
            error.into()
        })
}

fn path_config() -> web::PathConfig {
    web::PathConfig::default().error_handler(|err: PathError, _req| {
        let detail = match &err {
            PathError::Deserialize(e) => rule_violation(&e.to_string()).map(str::to_owned),
            _ => None,
        };
        RouterError::InvalidRequest(detail.unwrap_or_else(|| format!("invalid path: {err}"))).into()
    })
}

/// Unknown paths: a problem document rather than an empty 404.
pub async fn not_found(req: HttpRequest) -> Result<HttpResponse, RouterError> {
    Err(RouterError::NotFound(format!(
        "no route for {}",
        req.path()
    )))
}

pub(crate) async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    let problem = schema::wire::Problem::new(
        schema::wire::ProblemType::InvalidRequest,
        format!("{} is not allowed on {}", req.method(), req.path()),
    )
    .with_status(405);
    let mut response = HttpResponse::MethodNotAllowed();
    if let Some(allow) = req
        .match_pattern()
        .and_then(|pattern| schema::routes::allowed_methods(&pattern))
    {
        response.insert_header((actix_web::http::header::ALLOW, allow));
    }
    crate::error::problem_response(response, &problem)
}
