//! The public HTTP surface: the same paths as the allocator's API (DESIGN.md §9) plus orders.
//!
//! Bodies and path segments deserialise into the parsed wire values ([`schema::wire::Sku`],
//! [`schema::wire::ReservationId`], ...: the same rules and words as the allocator); handlers
//! compute the partition and hand the request to [`crate::forward`]. Malformed JSON,
//! unknown fields and bad path segments are answered here with a `400` problem, oversized bodies
//! with `413`, in the allocator's words ([`edge::problem`]); they are never forwarded and never
//! reach a `500`.

pub mod health;
pub mod inventory;
pub mod orders;
pub mod partitions;
pub mod reservations;

use actix_web::web;
use edge::problem::{json_config, path_config, resource};
use schema::routes;

/// Register every route.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(json_config())
        .app_data(path_config())
        .service(resource(routes::RESERVE.path).route(web::post().to(reservations::create)))
        .service(resource(routes::GET_RESERVATION.path).route(web::get().to(reservations::get)))
        .service(resource(routes::CONFIRM.path).route(web::post().to(reservations::confirm)))
        .service(resource(routes::RELEASE.path).route(web::post().to(reservations::release)))
        .service(resource(routes::GET_INVENTORY.path).route(web::get().to(inventory::get)))
        .service(resource(routes::ADJUST.path).route(web::post().to(inventory::adjust)))
        .service(resource(routes::INVENTORY_HISTORY.path).route(web::get().to(inventory::history)))
        .service(resource(routes::RESERVE_ORDER.path).route(web::post().to(orders::create)))
        .service(resource(routes::PARTITIONS.path).route(web::get().to(partitions::get)))
        .service(
            resource(routes::SETTLEMENT_STATUS.path).route(web::get().to(partitions::settlement)),
        )
        .service(resource(routes::EVENTS.path).route(web::get().to(partitions::events)))
        .service(resource(routes::HEALTHZ.path).route(web::get().to(health::healthz)))
        .service(resource(routes::READYZ.path).route(web::get().to(health::readyz)))
        .service(resource(routes::METRICS.path).route(web::get().to(health::metrics)));
}
