//! `X-Request-Id`: the router sends its request's id on every forwarded attempt; the replica logs
//! it on the request's span and echoes it, so one client request can be followed from the
//! router's logs into the owner's. A request without an acceptable id (1–128 visible ASCII
//! characters) gets a random one.

use std::future::Future;

use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use schema::wire::{RequestId, HEADER_REQUEST_ID};
use tracing::Instrument;

/// Middleware (`App::wrap_fn`): give the request its id and span, and put the id on the response.
pub fn middleware<S, B>(
    request: ServiceRequest,
    service: &S,
) -> impl Future<Output = Result<ServiceResponse<B>, actix_web::Error>>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    let id = request
        .headers()
        .get(HEADER_REQUEST_ID)
        .and_then(|value| RequestId::parse(value.as_bytes()))
        .unwrap_or_else(|| RequestId::from_random(rand::random()));
    // The id only: the span's fields are formatted (as JSON) when it is created, for every
    // request, logged or not; what a request's log lines need besides the id they carry
    // themselves (a refusal logs method and path).
    let span = tracing::info_span!("request", request_id = %id);
    let response = service.call(request).instrument(span);
    async move {
        let mut response = response.await?;
        if let Ok(value) = HeaderValue::from_str(id.as_str()) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(HEADER_REQUEST_ID), value);
        }
        Ok(response)
    }
}
