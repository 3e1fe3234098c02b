//! `X-Request-Id`: every request gets an id (the client's when it is 1–128 visible ASCII
//! characters, else a random one), logged on the request's span and returned on the response.
//! The router sends it to the allocator on every upstream attempt ([`current`]) and the
//! allocator echoes it, so one client request can be followed from the router's logs into the
//! owner's.

use std::future::Future;

use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use schema::wire::{RequestId, HEADER_REQUEST_ID};
use tracing::Instrument;

tokio::task_local! {
    /// The id of the request the current task works for.
    static CURRENT: RequestId;
}

/// The id of the request being served by this task, if any.
pub fn current() -> Option<RequestId> {
    CURRENT.try_with(Clone::clone).ok()
}

/// Run `future` (typically spawned onto another task) as part of the current request: same id,
/// same log span.
pub fn propagate<F: Future>(future: F) -> impl Future<Output = F::Output> {
    let span = tracing::Span::current();
    let id = current();
    async move {
        match id {
            Some(id) => CURRENT.scope(id, future.instrument(span)).await,
            None => future.instrument(span).await,
        }
    }
}

/// The client's id, or a new one.
fn of(request: &ServiceRequest) -> RequestId {
    request
        .headers()
        .get(HEADER_REQUEST_ID)
        .and_then(|value| RequestId::parse(value.as_bytes()))
        .unwrap_or_else(|| RequestId::from_random(rand::random()))
}

/// Middleware (`App::wrap_fn`): give the request its id and span, and put the id on the response.
/// A forwarded answer already carries the id as the allocator echoed it, and keeps it.
pub fn middleware<S, B>(
    request: ServiceRequest,
    service: &S,
) -> impl Future<Output = Result<ServiceResponse<B>, actix_web::Error>>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    let id = of(&request);
    // The id only: the span's fields are formatted (as JSON) when it is created, for every
    // request, logged or not; what a request's log lines need besides the id they carry
    // themselves (a refusal logs method and path).
    let span = tracing::info_span!("request", request_id = %id);
    let response = CURRENT.scope(id.clone(), service.call(request).instrument(span));
    async move {
        let mut response = response.await?;
        let name = HeaderName::from_static(HEADER_REQUEST_ID);
        if !response.headers().contains_key(&name) {
            if let Ok(value) = HeaderValue::from_str(id.as_str()) {
                response.headers_mut().insert(name, value);
            }
        }
        Ok(response)
    }
}
