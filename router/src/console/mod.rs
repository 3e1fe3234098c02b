//! What a router serves for people rather than programs: its API document and the page that
//! renders it, and a live operations page with the JSON it is drawn from.
//!
//! * `GET /openapi.json`: [`schema::openapi::document`] for [`Service::Router`], derived from the
//!   shared document once, when the workers are configured, and served as the same bytes after.
//! * `GET /docs`: the shared, self-contained viewer of that document ([`openapi::DOCS_PAGE`]).
//! * `GET /v1/cluster/overview`: the lease map, the replicas and the settlement job as PostgreSQL
//!   has them now, the map revision this router routes by, and the router's own traffic over the
//!   last minute ([`traffic`]). See [`overview`].
//! * `GET /ui`: a plain HTML page (`router/assets/ui.html`, compiled in) that polls the overview
//!   every second and draws it. It has no dependencies and loads nothing from other origins, so it
//!   works on an isolated network; its elements carry `data-` attributes (partition, owner,
//!   epoch, replica, liveness) so that tests and scripts can read state without scraping text.
//!
//! Everything is registered by [`Console::configure`] and traffic is counted by [`record`], a
//! middleware that reads the shared [`Traffic`] from the app data; the wiring adds both with one
//! line each. The pages are served with a same-origin `Content-Security-Policy`
//! ([`openapi::PAGE_CSP`]).

pub mod overview;
pub mod traffic;

use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::{web, HttpResponse};
use edge::problem::resource;
use futures::FutureExt;
use schema::openapi;
use schema::routes::{self, Service};

pub use traffic::Traffic;

/// The operations page.
pub const UI_PAGE: &str = include_str!("../../assets/ui.html");

static DOCUMENT: LazyLock<web::Bytes> = LazyLock::new(|| {
    let document = openapi::document(Service::Router);
    web::Bytes::from(serde_json::to_vec_pretty(&document).expect("a JSON value serialises"))
});

/// State shared by every HTTP worker; build it once, outside actix's per-worker factory.
#[derive(Clone, Default)]
pub struct Console {
    traffic: Arc<Traffic>,
}

impl Console {
    pub fn new() -> Self {
        Self::default()
    }

    /// Register the routes and the traffic ring (for [`record`] and the overview).
    pub fn configure(&self, cfg: &mut web::ServiceConfig) {
        LazyLock::force(&DOCUMENT);
        cfg.app_data(web::Data::from(self.traffic.clone()))
            .service(resource(routes::OPENAPI.path).route(web::get().to(document)))
            .service(resource(routes::DOCS.path).route(web::get().to(docs_page)))
            .service(resource(routes::UI.path).route(web::get().to(ui_page)))
            .service(
                resource(routes::CLUSTER_OVERVIEW.path).route(web::get().to(overview::overview)),
            );
    }
}

/// Whether a request counts as traffic: the API under `/v1/`, except the overview, so that the
/// operations page (which polls it every second) does not measure itself.
fn counted(path: &str) -> bool {
    path.starts_with("/v1/") && path != routes::CLUSTER_OVERVIEW.path
}

/// Middleware (`App::wrap_fn`): count each API request and its latency in the [`Traffic`] ring
/// registered by [`Console::configure`].
pub fn record<S, B>(
    request: ServiceRequest,
    service: &S,
) -> impl Future<Output = Result<ServiceResponse<B>, actix_web::Error>>
where
    S: actix_web::dev::Service<
        ServiceRequest,
        Response = ServiceResponse<B>,
        Error = actix_web::Error,
    >,
{
    let traffic = if counted(request.path()) {
        request.app_data::<web::Data<Traffic>>().cloned()
    } else {
        None
    };
    let started = Instant::now();
    service.call(request).map(move |result| {
        if let Some(traffic) = traffic {
            let status = match &result {
                Ok(response) => response.status(),
                Err(error) => error.as_response_error().status_code(),
            };
            let stages = result.as_ref().ok().and_then(|response| {
                actix_web::HttpMessage::extensions(response.request())
                    .get::<crate::forward::stages::Times>()
                    .copied()
            });
            traffic.record(started, started.elapsed(), status.is_server_error(), stages);
        }
        result
    })
}

async fn document() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(DOCUMENT.clone())
}

fn page(body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CONTENT_SECURITY_POLICY, openapi::PAGE_CSP))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}

async fn docs_page() -> HttpResponse {
    page(openapi::DOCS_PAGE)
}

async fn ui_page() -> HttpResponse {
    page(UI_PAGE)
}
