//! `GET /openapi.json` and `GET /docs`: the replica's own API document and the page that renders
//! it.
//!
//! The document is [`schema::openapi::document`] for [`Service::Allocator`]: the shared,
//! hand-written document reduced to the routes a replica serves. It is derived and serialised
//! once, when the HTTP workers are configured, and every request gets the same bytes; the page is
//! a constant compiled into the binary, so neither handler touches the database or blocks.

use std::sync::LazyLock;

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use schema::openapi::{self, PAGE_CSP};
use schema::routes::{self, Service};

use super::resource;

static DOCUMENT: LazyLock<web::Bytes> = LazyLock::new(|| {
    let document = openapi::document(Service::Allocator);
    web::Bytes::from(serde_json::to_vec_pretty(&document).expect("a JSON value serialises"))
});

/// Register both routes; derives the document now rather than on the first request.
pub fn configure(cfg: &mut web::ServiceConfig) {
    LazyLock::force(&DOCUMENT);
    cfg.service(resource(routes::OPENAPI.path).route(web::get().to(document)))
        .service(resource(routes::DOCS.path).route(web::get().to(page)));
}

async fn document() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(DOCUMENT.clone())
}

async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CONTENT_SECURITY_POLICY, PAGE_CSP))
        .body(openapi::DOCS_PAGE)
}
