//! The actix middleware that applies a [`Gate`] to every request of an `App`.
//!
//! Wrap it innermost (`.wrap(AccessControl::new(gate))` before the request-id and latency
//! middlewares) so that refusals are logged under the request's id and counted by route and
//! status like any other answer.

use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::{Error, ResponseError};

use crate::gate::Gate;

tokio::task_local! {
    /// The client the current request is served for; the router's forwarder reads it.
    static CLIENT: String;
}

/// The client the request being served by this task is for (`None` on open paths and outside a
/// request).
pub fn current_client() -> Option<String> {
    CLIENT.try_with(Clone::clone).ok()
}

/// Run `future` (spawned for the current request) as the current request's client.
pub fn with_current_client<F: Future>(future: F) -> impl Future<Output = F::Output> {
    let client = current_client();
    async move {
        match client {
            Some(client) => CLIENT.scope(client, future).await,
            None => future.await,
        }
    }
}

/// `App::wrap(AccessControl::new(gate))`.
#[derive(Clone)]
pub struct AccessControl {
    gate: Arc<Gate>,
}

impl AccessControl {
    pub fn new(gate: Arc<Gate>) -> Self {
        AccessControl { gate }
    }
}

impl<S, B> Transform<S, ServiceRequest> for AccessControl
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Transform = AccessService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(AccessService {
            service: Rc::new(service),
            gate: self.gate.clone(),
        }))
    }
}

pub struct AccessService<S> {
    service: Rc<S>,
    gate: Arc<Gate>,
}

type LocalBoxFuture<T> = Pin<Box<dyn Future<Output = T>>>;

impl<S, B> Service<ServiceRequest> for AccessService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Future = LocalBoxFuture<Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let template = request.match_pattern();
        let decision = self.gate.admit(
            request.method().as_str(),
            request.path(),
            template.as_deref(),
            request.headers(),
            Instant::now(),
        );
        match decision {
            Err(error) => {
                let response = request.into_response(error.error_response());
                Box::pin(ready(Ok(response.map_into_right_body())))
            }
            Ok(admitted) => {
                if admitted.trusted_router {
                    use actix_web::HttpMessage;
                    request.extensions_mut().insert(crate::gate::TrustedRouter);
                }
                let service = self.service.clone();
                Box::pin(async move {
                    let call = service.call(request);
                    let response = match admitted.client {
                        Some(client) => CLIENT.scope(client, call).await,
                        None => call.await,
                    };
                    // The in-flight slot is held until the answer is ready.
                    drop(admitted.slot);
                    Ok(response?.map_into_left_body())
                })
            }
        }
    }
}
